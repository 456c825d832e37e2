//! The invariants a run must keep, each a pure function over what was recorded: the events
//! every watcher saw (with the time it saw them), the writes the workload driver had
//! acknowledged, and the objects left at the end. Each violation names the object, the time
//! and the evidence.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;
use serde_json::Value;

/// What a watcher saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Kind {
    /// A LIST answered at `rv`: a new run of events starts from it (nothing before is
    /// promised to follow).
    ListStart,
    /// An object of that LIST.
    Listed,
    Added,
    Modified,
    Deleted,
    /// Everything up to `rv` has been delivered.
    Bookmark,
    /// The watch ended with 410 Gone: the watcher relists.
    Gone,
}

/// An object's owner by controller reference.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Owner {
    pub kind: String,
    pub name: String,
    pub uid: String,
}

/// The parts of an object the checkers read.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Facts {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub controller: Option<Owner>,
    /// `metadata.deletionTimestamp` is set.
    pub terminating: bool,
    /// A pod in phase `Succeeded` or `Failed`.
    pub finished: bool,
    /// `spec.replicas` (absent means 1); a Job's `spec.parallelism` (absent means 1).
    pub replicas: Option<i64>,
    /// A Deployment's `maxSurge` resolved against its replicas (rounded up, as upstream).
    pub max_surge: Option<i64>,
    /// A StatefulSet pod's ordinal (`apps.kubernetes.io/pod-index`).
    pub ordinal: Option<i64>,
    /// A Lease's `holderIdentity` and `leaseTransitions`.
    pub holder: Option<String>,
    pub transitions: Option<i64>,
}

impl Facts {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        if self.namespace.is_empty() {
            self.name.clone()
        } else {
            format!("{}/{}", self.namespace, self.name)
        }
    }

    /// Reads the facts of an object of `resource` (a plural: `pods`, `replicasets`, …).
    pub fn of(resource: &str, obj: &Value) -> Facts {
        let meta = &obj["metadata"];
        let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
        let controller = meta["ownerReferences"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["controller"].as_bool() == Some(true))
            .map(|r| Owner {
                kind: s(&r["kind"]),
                name: s(&r["name"]),
                uid: s(&r["uid"]),
            });
        let phase = obj["status"]["phase"].as_str().unwrap_or_default();
        let replicas = match resource {
            "replicasets" | "deployments" | "statefulsets" => {
                Some(obj["spec"]["replicas"].as_i64().unwrap_or(1))
            }
            "jobs" => Some(obj["spec"]["parallelism"].as_i64().unwrap_or(1)),
            _ => None,
        };
        let max_surge = (resource == "deployments").then(|| {
            let surge = &obj["spec"]["strategy"]["rollingUpdate"]["maxSurge"];
            resolve_surge(surge, replicas.unwrap_or(1))
        });
        Facts {
            namespace: s(&meta["namespace"]),
            name: s(&meta["name"]),
            uid: s(&meta["uid"]),
            controller,
            terminating: !meta["deletionTimestamp"].is_null(),
            finished: phase == "Succeeded" || phase == "Failed",
            replicas,
            max_surge,
            ordinal: meta["labels"]["apps.kubernetes.io/pod-index"]
                .as_str()
                .and_then(|o| o.parse().ok()),
            holder: (resource == "leases").then(|| s(&obj["spec"]["holderIdentity"])),
            transitions: (resource == "leases")
                .then(|| obj["spec"]["leaseTransitions"].as_i64().unwrap_or(0)),
        }
    }
}

/// `maxSurge` (an integer, or a percentage rounded up; upstream's default 25 %) of
/// `replicas`. A Recreate Deployment has no `rollingUpdate`, and then surges 0 in effect; the
/// workload uses only RollingUpdate.
fn resolve_surge(surge: &Value, replicas: i64) -> i64 {
    match surge {
        Value::Number(n) => n.as_i64().unwrap_or(0),
        Value::String(p) => match p.strip_suffix('%').and_then(|p| p.parse::<i64>().ok()) {
            Some(p) => (replicas * p + 99) / 100,
            None => 0,
        },
        _ => (replicas * 25 + 99) / 100,
    }
}

/// One event as a watcher saw it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Observed {
    /// Milliseconds since the run started.
    pub at_ms: u64,
    /// Which watcher (`pods#0`): each resource is watched by more than one.
    pub watcher: String,
    /// The resource's plural.
    pub resource: String,
    pub kind: Kind,
    pub rv: u64,
    pub object: Option<Facts>,
}

/// A write the workload driver made and the server acknowledged.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AckedWrite {
    pub at_ms: u64,
    /// `deployments/chaos/web-0`.
    pub object: String,
    /// A JSON pointer into the object (`/spec/replicas`).
    pub field: String,
    pub value: Value,
    /// The resourceVersion the acknowledgement carried.
    pub rv: u64,
}

/// A broken invariant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Violation {
    pub invariant: &'static str,
    pub object: String,
    pub at_ms: u64,
    pub evidence: String,
}

pub const RS_BOUND: &str = "replicaset-pods-within-bound";
pub const DEPLOYMENT_SURGE: &str = "deployment-within-replicas-plus-surge";
pub const STS_ORDINAL: &str = "statefulset-ordinal-unique";
pub const ORPHANS: &str = "no-orphans";
pub const LOST_WRITE: &str = "no-lost-acknowledged-write";
pub const LEADER_TERM: &str = "one-leader-per-lease-term";
pub const RV_ORDER: &str = "resource-versions-increase";
pub const RV_GAP: &str = "no-watch-gap-without-410";
pub const JOB_PARALLELISM: &str = "job-pods-within-parallelism";

/// What each LIST of `resource` showed: its resourceVersion and the uids of the objects then.
/// A LIST after a 410 sends no DELETED events for what went away meanwhile: an object a
/// snapshot does not hold was gone by its revision.
fn snapshots(events: &[Observed], resource: &str) -> Vec<(u64, HashSet<String>)> {
    let mut out: Vec<(u64, HashSet<String>)> = Vec::new();
    // The watcher whose LIST is being read, and where its snapshot is in `out`.
    let mut open: HashMap<&str, usize> = HashMap::new();
    for e in events.iter().filter(|e| e.resource == resource) {
        match e.kind {
            Kind::ListStart => {
                open.insert(e.watcher.as_str(), out.len());
                out.push((e.rv, HashSet::new()));
            }
            Kind::Listed => {
                if let (Some(&i), Some(f)) = (open.get(e.watcher.as_str()), &e.object) {
                    out[i].1.insert(f.uid.clone());
                }
            }
            _ => {
                open.remove(e.watcher.as_str());
            }
        }
    }
    out.sort_by_key(|(rv, _)| *rv);
    out
}

/// Applies, to objects tracked as uid → (…, last resourceVersion seen), every snapshot older
/// than `rv` not applied yet: what a snapshot lacks and was not seen after it is gone.
fn apply_snapshots<T>(
    snaps: &[(u64, HashSet<String>)],
    next: &mut usize,
    rv: u64,
    tracked: &mut HashMap<String, (T, u64)>,
) {
    while *next < snaps.len() && snaps[*next].0 < rv {
        let (at, uids) = &snaps[*next];
        tracked.retain(|uid, (_, seen)| uids.contains(uid) || *seen > *at);
        *next += 1;
    }
}

/// Every watcher's object events merged into one history: each (resource, object,
/// resourceVersion) once, in resourceVersion order. The store's revision is global, so
/// this is the order the writes were committed in, across resources.
fn history(events: &[Observed]) -> Vec<&Observed> {
    let mut seen = HashSet::new();
    let mut out: Vec<&Observed> = events
        .iter()
        .filter(|e| {
            matches!(
                e.kind,
                Kind::Listed | Kind::Added | Kind::Modified | Kind::Deleted
            )
        })
        .filter(|e| {
            let o = e.object.as_ref().map(|o| o.uid.as_str()).unwrap_or("");
            seen.insert((e.resource.as_str(), o, e.rv, e.kind == Kind::Deleted))
        })
        .collect();
    // A deletion is its own revision, after the object's last version.
    out.sort_by_key(|e| (e.rv, e.kind == Kind::Deleted));
    out
}

/// Whether a pod counts against its controller: not being deleted, not finished.
fn live(f: &Facts) -> bool {
    !f.terminating && !f.finished
}

/// The names of the live pods among `pods` (by uid, with the last resourceVersion seen) whose
/// controller is `owner_uid`, in no particular order.
fn live_pods_of<'a>(pods: &'a HashMap<String, (Facts, u64)>, owner_uid: &str) -> Vec<&'a str> {
    pods.values()
        .map(|(p, _)| p)
        .filter(|p| live(p) && p.controller.as_ref().map(|o| o.uid.as_str()) == Some(owner_uid))
        .map(|p| p.name.as_str())
        .collect()
}

/// No ReplicaSet controller creates a pod beyond the ReplicaSet's `spec.replicas`, and no
/// Deployment controller raises its ReplicaSets' replicas past the Deployment's replicas plus
/// `maxSurge`. Checked when each pod first appears (against the live pods of its ReplicaSet
/// at that revision) and when a ReplicaSet's replicas grow (against its Deployment at that
/// revision).
pub fn replica_bounds(events: &[Observed]) -> Vec<Violation> {
    let mut out = Vec::new();
    // uid → facts, latest version.
    let mut rs: HashMap<String, Facts> = HashMap::new();
    let mut deployments: HashMap<String, Facts> = HashMap::new();
    // pod uid → facts, last resourceVersion seen
    let mut pods: HashMap<String, (Facts, u64)> = HashMap::new();
    let snaps = snapshots(events, "pods");
    let mut applied = 0;
    for e in history(events) {
        if e.resource == "pods" {
            apply_snapshots(&snaps, &mut applied, e.rv, &mut pods);
        }
        let Some(f) = e.object.as_ref() else { continue };
        match e.resource.as_str() {
            "deployments" => {
                if e.kind == Kind::Deleted {
                    deployments.remove(&f.uid);
                } else {
                    deployments.insert(f.uid.clone(), f.clone());
                }
            }
            "replicasets" => {
                if e.kind == Kind::Deleted {
                    rs.remove(&f.uid);
                    continue;
                }
                let grew =
                    f.replicas.unwrap_or(0) > rs.get(&f.uid).and_then(|o| o.replicas).unwrap_or(0);
                rs.insert(f.uid.clone(), f.clone());
                let Some(owner) = f.controller.as_ref() else {
                    continue;
                };
                let Some(d) = deployments.get(&owner.uid) else {
                    continue;
                };
                if !grew || f.terminating {
                    continue;
                }
                let total: i64 = rs
                    .values()
                    .filter(|r| r.controller.as_ref().map(|o| &o.uid) == Some(&owner.uid))
                    .map(|r| r.replicas.unwrap_or(0))
                    .sum();
                let bound = d.replicas.unwrap_or(1) + d.max_surge.unwrap_or(0);
                if total > bound {
                    out.push(Violation {
                        invariant: DEPLOYMENT_SURGE,
                        object: format!("deployments/{}", d.key()),
                        at_ms: e.at_ms,
                        evidence: format!(
                            "at resourceVersion {} ReplicaSet {} grew to {} replicas: its ReplicaSets ask for {total}, over {} replicas + {} maxSurge",
                            e.rv,
                            f.name,
                            f.replicas.unwrap_or(0),
                            d.replicas.unwrap_or(1),
                            d.max_surge.unwrap_or(0)
                        ),
                    });
                }
            }
            "pods" => {
                if e.kind == Kind::Deleted {
                    pods.remove(&f.uid);
                    continue;
                }
                let new = pods.insert(f.uid.clone(), (f.clone(), e.rv)).is_none();
                let Some(owner) = f.controller.as_ref().filter(|o| o.kind == "ReplicaSet") else {
                    continue;
                };
                if !new || !live(f) {
                    continue;
                }
                let Some(r) = rs.get(&owner.uid) else {
                    continue;
                };
                let mut names = live_pods_of(&pods, &owner.uid);
                let bound = r.replicas.unwrap_or(0);
                if names.len() as i64 > bound {
                    names.sort_unstable();
                    out.push(Violation {
                        invariant: RS_BOUND,
                        object: format!("replicasets/{}", r.key()),
                        at_ms: e.at_ms,
                        evidence: format!(
                            "pod {} created at resourceVersion {} made {} live pods for {bound} replicas: {}",
                            f.name,
                            e.rv,
                            names.len(),
                            names.join(", ")
                        ),
                    });
                }
            }
            _ => {}
        }
    }
    out
}

/// No Job controller runs more pods of a Job at once than its `parallelism`: checked when
/// each pod of a Job first appears, against the Job's live pods at that revision.
pub fn job_parallelism(events: &[Observed]) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut jobs: HashMap<String, Facts> = HashMap::new();
    let mut pods: HashMap<String, (Facts, u64)> = HashMap::new();
    let snaps = snapshots(events, "pods");
    let mut applied = 0;
    for e in history(events) {
        if e.resource == "pods" {
            apply_snapshots(&snaps, &mut applied, e.rv, &mut pods);
        }
        let Some(f) = e.object.as_ref() else { continue };
        match (e.resource.as_str(), e.kind) {
            ("jobs", Kind::Deleted) => {
                jobs.remove(&f.uid);
            }
            ("jobs", _) => {
                jobs.insert(f.uid.clone(), f.clone());
            }
            ("pods", Kind::Deleted) => {
                pods.remove(&f.uid);
            }
            ("pods", _) => {
                let new = pods.insert(f.uid.clone(), (f.clone(), e.rv)).is_none();
                let Some(owner) = f.controller.as_ref().filter(|o| o.kind == "Job") else {
                    continue;
                };
                let Some(job) = jobs.get(&owner.uid).filter(|_| new && live(f)) else {
                    continue;
                };
                let mut alive = live_pods_of(&pods, &owner.uid);
                let bound = job.replicas.unwrap_or(1);
                if alive.len() as i64 > bound {
                    alive.sort_unstable();
                    out.push(Violation {
                        invariant: JOB_PARALLELISM,
                        object: format!("jobs/{}", job.key()),
                        at_ms: e.at_ms,
                        evidence: format!(
                            "pod {} created at resourceVersion {} made {} live pods for parallelism {bound}: {}",
                            f.name,
                            e.rv,
                            alive.len(),
                            alive.join(", ")
                        ),
                    });
                }
            }
            _ => {}
        }
    }
    out
}

/// StatefulSet pods by uid: their (statefulset uid, ordinal) and name, and the last
/// resourceVersion seen.
type OrdinalPods = HashMap<String, (((String, i64), String), u64)>;

/// No StatefulSet ordinal ever had two pods at once: a pod for an ordinal appears only after
/// the previous pod of that ordinal is gone (terminating still counts: it may still run).
pub fn statefulset_ordinals(events: &[Observed]) -> Vec<Violation> {
    let mut out = Vec::new();
    let snaps = snapshots(events, "pods");
    let mut applied = 0;
    let mut pods: OrdinalPods = HashMap::new();
    let mut reported = HashSet::new();
    for e in history(events) {
        if e.resource != "pods" {
            continue;
        }
        apply_snapshots(&snaps, &mut applied, e.rv, &mut pods);
        let Some(f) = e.object.as_ref() else { continue };
        let Some(owner) = f.controller.as_ref().filter(|o| o.kind == "StatefulSet") else {
            continue;
        };
        let ordinal = f.ordinal.or_else(|| {
            f.name
                .strip_prefix(&format!("{}-", owner.name))
                .and_then(|o| o.parse().ok())
        });
        let Some(ordinal) = ordinal else { continue };
        let slot = (owner.uid.clone(), ordinal);
        if e.kind == Kind::Deleted {
            pods.remove(&f.uid);
            continue;
        }
        let other = pods
            .iter()
            .find(|(uid, ((s, _), _))| *s == slot && **uid != f.uid)
            .map(|(uid, ((_, name), _))| (uid.clone(), name.clone()));
        pods.insert(f.uid.clone(), ((slot.clone(), f.name.clone()), e.rv));
        if let Some((uid, name)) = other {
            if reported.insert((f.uid.clone(), uid.clone())) {
                out.push(Violation {
                    invariant: STS_ORDINAL,
                    object: format!("statefulsets/{}/{}", f.namespace, owner.name),
                    at_ms: e.at_ms,
                    evidence: format!(
                        "ordinal {ordinal}: pod {} (uid {}) appeared at resourceVersion {} while pod {name} (uid {uid}) still existed",
                        f.name, f.uid, e.rv
                    ),
                });
            }
        }
    }
    out
}

/// An object left at the end: its resource and facts.
#[derive(Clone, Debug)]
pub struct Remaining {
    pub resource: String,
    pub facts: Facts,
}

/// No pod or ReplicaSet is left whose controller no longer exists (or is another object of
/// the same name: the owner reference names a uid).
pub fn orphans(at_ms: u64, remaining: &[Remaining]) -> Vec<Violation> {
    let uids: HashSet<&str> = remaining.iter().map(|r| r.facts.uid.as_str()).collect();
    remaining
        .iter()
        .filter(|r| matches!(r.resource.as_str(), "pods" | "replicasets"))
        .filter_map(|r| {
            let owner = r.facts.controller.as_ref()?;
            (!uids.contains(owner.uid.as_str())).then(|| Violation {
                invariant: ORPHANS,
                object: format!("{}/{}", r.resource, r.facts.key()),
                at_ms,
                evidence: format!(
                    "its controller {} {} (uid {}) no longer exists",
                    owner.kind, owner.name, owner.uid
                ),
            })
        })
        .collect()
}

/// Every acknowledged write is still there: the last value acknowledged for each field is
/// the value the object holds at the end (`finals`: object → the object as read then).
pub fn lost_writes(
    at_ms: u64,
    acked: &[AckedWrite],
    finals: &HashMap<String, Value>,
) -> Vec<Violation> {
    let mut last: BTreeMap<(&str, &str), &AckedWrite> = BTreeMap::new();
    for w in acked {
        let k = (w.object.as_str(), w.field.as_str());
        if last.get(&k).is_none_or(|p| p.rv <= w.rv) {
            last.insert(k, w);
        }
    }
    last.into_iter()
        .filter_map(|((object, field), w)| {
            let now = finals.get(object).and_then(|o| o.pointer(field));
            (now != Some(&w.value)).then(|| Violation {
                invariant: LOST_WRITE,
                object: object.to_string(),
                at_ms,
                evidence: format!(
                    "{field} was acknowledged as {} at resourceVersion {} ({} ms) but is {}",
                    w.value,
                    w.rv,
                    w.at_ms,
                    now.map(Value::to_string)
                        .unwrap_or_else(|| "absent (the object is gone)".into())
                ),
            })
        })
        .collect()
}

/// Two holders never led in the same term: each `leaseTransitions` value of a Lease is held by
/// one identity, and the count never goes back. (A released Lease has no holder, which
/// belongs to no one's term.)
pub fn leader_terms(events: &[Observed]) -> Vec<Violation> {
    let mut out = Vec::new();
    // lease → (transitions → holder), highest transitions seen
    let mut terms: HashMap<String, (HashMap<i64, String>, i64)> = HashMap::new();
    for e in history(events) {
        if e.resource != "leases" || e.kind == Kind::Deleted {
            continue;
        }
        let Some(f) = e.object.as_ref() else { continue };
        let (Some(holder), Some(t)) = (f.holder.as_ref(), f.transitions) else {
            continue;
        };
        let (seen, highest) = terms.entry(f.key()).or_insert((HashMap::new(), 0));
        if t < *highest {
            out.push(Violation {
                invariant: LEADER_TERM,
                object: format!("leases/{}", f.key()),
                at_ms: e.at_ms,
                evidence: format!(
                    "leaseTransitions went back from {highest} to {t} at resourceVersion {}",
                    e.rv
                ),
            });
        }
        *highest = (*highest).max(t);
        if holder.is_empty() {
            continue;
        }
        match seen.get(&t) {
            Some(h) if h != holder => out.push(Violation {
                invariant: LEADER_TERM,
                object: format!("leases/{}", f.key()),
                at_ms: e.at_ms,
                evidence: format!(
                    "term {t} held by {h} and then by {holder} (resourceVersion {})",
                    e.rv
                ),
            }),
            Some(_) => {}
            None => {
                seen.insert(t, holder.clone());
            }
        }
    }
    out
}

/// The object events of one resource any watcher saw: (resourceVersion, object uid) → the
/// object's key and when a watcher saw it.
type SeenEvents<'a> = BTreeMap<(u64, &'a str), (String, u64)>;

/// Per watcher: each object's resourceVersions strictly increase (a relist may show an object
/// again at the version already seen, never an older one), and no event any watcher of the
/// same resource saw inside the range a watcher covered without a 410 is missing from it.
pub fn watch_order_and_gaps(events: &[Observed]) -> Vec<Violation> {
    let mut out = Vec::new();
    // Everything seen per resource: (rv, object uid) → key, time.
    let mut all: HashMap<&str, SeenEvents> = HashMap::new();
    for e in events {
        if let (Kind::Added | Kind::Modified | Kind::Deleted, Some(f)) = (e.kind, &e.object) {
            all.entry(e.resource.as_str())
                .or_default()
                .insert((e.rv, f.uid.as_str()), (f.key(), e.at_ms));
        }
    }
    let mut by_watcher: BTreeMap<&str, Vec<&Observed>> = BTreeMap::new();
    for e in events {
        by_watcher.entry(e.watcher.as_str()).or_default().push(e);
    }
    for (watcher, seen) in by_watcher {
        let resource = seen[0].resource.as_str();
        let mut last: HashMap<&str, u64> = HashMap::new();
        // The current run of events: where it started, how far it got, what it saw.
        let mut start: Option<u64> = None;
        let mut end = 0;
        let mut got: HashSet<(u64, &str)> = HashSet::new();
        let mut segments = Vec::new();
        for e in &seen {
            match e.kind {
                Kind::ListStart => {
                    if let Some(s) = start.take() {
                        segments.push((s, end, std::mem::take(&mut got)));
                    }
                    start = Some(e.rv);
                    end = e.rv;
                }
                Kind::Gone => {
                    if let Some(s) = start.take() {
                        segments.push((s, end, std::mem::take(&mut got)));
                    }
                }
                Kind::Bookmark => end = end.max(e.rv),
                Kind::Listed | Kind::Added | Kind::Modified | Kind::Deleted => {
                    let Some(f) = e.object.as_ref() else { continue };
                    let relisted = e.kind == Kind::Listed;
                    if let Some(&prev) = last.get(f.uid.as_str()) {
                        let ok = if relisted { e.rv >= prev } else { e.rv > prev };
                        if !ok {
                            out.push(Violation {
                                invariant: RV_ORDER,
                                object: format!("{resource}/{}", f.key()),
                                at_ms: e.at_ms,
                                evidence: format!(
                                    "watcher {watcher} saw resourceVersion {} after {prev}",
                                    e.rv
                                ),
                            });
                        }
                    }
                    last.insert(f.uid.as_str(), e.rv);
                    if !relisted {
                        end = end.max(e.rv);
                        got.insert((e.rv, f.uid.as_str()));
                    }
                }
            }
        }
        if let Some(s) = start {
            segments.push((s, end, got));
        }
        let Some(everything) = all.get(resource) else {
            continue;
        };
        for (s, end, got) in segments {
            for ((rv, uid), (key, at_ms)) in everything.range((s + 1, "")..) {
                if *rv > end {
                    break;
                }
                if !got.contains(&(*rv, *uid)) {
                    out.push(Violation {
                        invariant: RV_GAP,
                        object: format!("{resource}/{key}"),
                        at_ms: *at_ms,
                        evidence: format!(
                            "watcher {watcher} covered resourceVersions {s}..{end} without a 410 but never saw resourceVersion {rv}"
                        ),
                    });
                }
            }
        }
    }
    out
}

/// Every checker over the events.
pub fn check_events(events: &[Observed]) -> Vec<Violation> {
    let mut out = replica_bounds(events);
    out.extend(statefulset_ordinals(events));
    out.extend(job_parallelism(events));
    out.extend(leader_terms(events));
    out.extend(watch_order_and_gaps(events));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A recorder of synthetic streams: every event goes to watchers `#0` and `#1` of its
    /// resource unless a test says otherwise.
    #[derive(Default)]
    struct Stream {
        events: Vec<Observed>,
        rv: u64,
    }

    impl Stream {
        fn start(&mut self, resources: &[&str]) {
            for r in resources {
                for w in 0..2 {
                    self.events.push(Observed {
                        at_ms: 0,
                        watcher: format!("{r}#{w}"),
                        resource: r.to_string(),
                        kind: Kind::ListStart,
                        rv: self.rv,
                        object: None,
                    });
                }
            }
        }

        /// Records `obj` as `kind` at the next revision, seen by `watchers`.
        fn event_for(&mut self, watchers: &[u32], resource: &str, kind: Kind, obj: Value) -> u64 {
            self.rv += 1;
            for w in watchers {
                self.events.push(Observed {
                    at_ms: self.rv * 10,
                    watcher: format!("{resource}#{w}"),
                    resource: resource.to_string(),
                    kind,
                    rv: self.rv,
                    object: Some(Facts::of(resource, &obj)),
                });
            }
            self.rv
        }

        fn event(&mut self, resource: &str, kind: Kind, obj: Value) -> u64 {
            self.event_for(&[0, 1], resource, kind, obj)
        }
    }

    /// The one violation in `v`, which must be of `invariant`.
    fn only(v: Vec<Violation>, invariant: &str) -> Violation {
        assert_eq!(v.len(), 1, "{v:?}");
        let one = v.into_iter().next().unwrap();
        assert_eq!(one.invariant, invariant);
        one
    }

    fn owned(kind: &str, name: &str, uid: &str) -> Value {
        json!([{"kind": kind, "name": name, "uid": uid, "controller": true}])
    }

    fn deployment(replicas: i64, surge: Value) -> Value {
        json!({"metadata": {"namespace": "chaos", "name": "web", "uid": "d1"},
               "spec": {"replicas": replicas, "strategy": {"rollingUpdate": {"maxSurge": surge}}}})
    }

    fn rs(name: &str, uid: &str, replicas: i64) -> Value {
        json!({"metadata": {"namespace": "chaos", "name": name, "uid": uid,
                            "ownerReferences": owned("Deployment", "web", "d1")},
               "spec": {"replicas": replicas}})
    }

    fn pod(name: &str, uid: &str, owner: Value) -> Value {
        json!({"metadata": {"namespace": "chaos", "name": name, "uid": uid, "ownerReferences": owner},
               "status": {"phase": "Running"}})
    }

    fn sts_pod(name: &str, uid: &str, ordinal: i64) -> Value {
        json!({"metadata": {"namespace": "chaos", "name": name, "uid": uid,
                            "labels": {"apps.kubernetes.io/pod-index": ordinal.to_string()},
                            "ownerReferences": owned("StatefulSet", "db", "s1")},
               "status": {"phase": "Running"}})
    }

    #[test]
    fn an_extra_pod_beyond_the_replicasets_replicas_is_reported() {
        let mut s = Stream::default();
        s.start(&["deployments", "replicasets", "pods"]);
        s.event("deployments", Kind::Added, deployment(2, json!(1)));
        s.event("replicasets", Kind::Added, rs("web-a", "r1", 2));
        let o = owned("ReplicaSet", "web-a", "r1");
        s.event("pods", Kind::Added, pod("web-a-1", "p1", o.clone()));
        s.event("pods", Kind::Added, pod("web-a-2", "p2", o.clone()));
        assert_eq!(replica_bounds(&s.events), vec![]);
        // A terminating pod no longer counts, so its replacement is within the bound …
        let mut gone = pod("web-a-1", "p1", o.clone());
        gone["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        s.event("pods", Kind::Modified, gone);
        s.event("pods", Kind::Added, pod("web-a-3", "p3", o.clone()));
        assert_eq!(replica_bounds(&s.events), vec![]);
        // … but a third live pod is not.
        s.event("pods", Kind::Added, pod("web-a-4", "p4", o));
        let v = only(replica_bounds(&s.events), RS_BOUND);
        assert_eq!(v.object, "replicasets/chaos/web-a");
        assert!(
            v.evidence.contains("web-a-4") && v.evidence.contains("3 live pods for 2"),
            "{}",
            v.evidence
        );
    }

    #[test]
    fn job_pods_beyond_parallelism_are_reported() {
        let mut s = Stream::default();
        s.start(&["jobs", "pods"]);
        let job = json!({"metadata": {"namespace": "chaos", "name": "batch", "uid": "j1"},
                         "spec": {"parallelism": 2, "completions": 4}});
        s.event("jobs", Kind::Added, job);
        let o = owned("Job", "batch", "j1");
        s.event("pods", Kind::Added, pod("batch-a", "p1", o.clone()));
        s.event("pods", Kind::Added, pod("batch-b", "p2", o.clone()));
        // A pod that succeeded no longer runs: its successor is within the bound …
        let mut done = pod("batch-a", "p1", o.clone());
        done["status"]["phase"] = json!("Succeeded");
        s.event("pods", Kind::Modified, done);
        s.event("pods", Kind::Added, pod("batch-c", "p3", o.clone()));
        assert_eq!(job_parallelism(&s.events), vec![]);
        // … a third running at once is not.
        s.event("pods", Kind::Added, pod("batch-d", "p4", o));
        let v = only(job_parallelism(&s.events), JOB_PARALLELISM);
        assert_eq!(v.object, "jobs/chaos/batch");
        assert!(
            v.evidence.contains("batch-d") && v.evidence.contains("3 live pods for parallelism 2"),
            "{}",
            v.evidence
        );
    }

    #[test]
    fn replicasets_growing_past_replicas_plus_surge_are_reported() {
        let mut s = Stream::default();
        s.start(&["deployments", "replicasets"]);
        s.event("deployments", Kind::Added, deployment(4, json!("25%")));
        s.event("replicasets", Kind::Added, rs("web-a", "r1", 4));
        // A rollout: the new ReplicaSet may take one surge pod (25 % of 4) …
        s.event("replicasets", Kind::Added, rs("web-b", "r2", 1));
        assert_eq!(replica_bounds(&s.events), vec![]);
        // … not two.
        s.event("replicasets", Kind::Modified, rs("web-b", "r2", 2));
        let v = only(replica_bounds(&s.events), DEPLOYMENT_SURGE);
        assert!(v
            .evidence
            .contains("ask for 6, over 4 replicas + 1 maxSurge"));
    }

    #[test]
    fn a_duplicate_statefulset_ordinal_is_reported() {
        let mut s = Stream::default();
        s.start(&["pods"]);
        s.event("pods", Kind::Added, sts_pod("db-0", "a", 0));
        s.event("pods", Kind::Added, sts_pod("db-1", "b", 1));
        // Replaced only after the old pod is gone: fine.
        s.event("pods", Kind::Deleted, sts_pod("db-1", "b", 1));
        s.event("pods", Kind::Added, sts_pod("db-1", "c", 1));
        assert_eq!(statefulset_ordinals(&s.events), vec![]);
        // A second pod claiming ordinal 0 while db-0 lives.
        s.event("pods", Kind::Added, sts_pod("db-0-rogue", "d", 0));
        let v = only(statefulset_ordinals(&s.events), STS_ORDINAL);
        assert!(v.evidence.contains("ordinal 0") && v.evidence.contains("db-0-rogue"));
    }

    #[test]
    fn a_deletion_only_a_relist_shows_is_no_duplicate_ordinal() {
        let mut s = Stream::default();
        s.start(&["pods"]);
        s.event("pods", Kind::Added, sts_pod("db-2", "old", 2));
        // Both watches end with 410 (an API server restart); db-2 is deleted meanwhile, and
        // the relists show it gone without a DELETED event.
        s.rv += 1;
        for w in 0..2 {
            let watcher = format!("pods#{w}");
            s.events.push(Observed {
                at_ms: 30,
                watcher: watcher.clone(),
                resource: "pods".into(),
                kind: Kind::Gone,
                rv: 0,
                object: None,
            });
            s.events.push(Observed {
                at_ms: 40,
                watcher,
                resource: "pods".into(),
                kind: Kind::ListStart,
                rv: s.rv,
                object: None,
            });
        }
        s.event("pods", Kind::Added, sts_pod("db-2", "new", 2));
        assert_eq!(statefulset_ordinals(&s.events), vec![]);
        // Without the relists, the same stream is a duplicate, reported once however often
        // the new pod changes.
        let mut s = Stream::default();
        s.start(&["pods"]);
        s.event("pods", Kind::Added, sts_pod("db-2", "old", 2));
        s.event("pods", Kind::Added, sts_pod("db-2", "new", 2));
        s.event("pods", Kind::Modified, sts_pod("db-2", "new", 2));
        assert_eq!(statefulset_ordinals(&s.events).len(), 1);
    }

    #[test]
    fn orphans_are_reported() {
        let remaining = vec![
            Remaining {
                resource: "replicasets".into(),
                facts: Facts::of("replicasets", &rs("web-a", "r1", 1)),
            },
            Remaining {
                resource: "pods".into(),
                facts: Facts::of("pods", &pod("p", "p1", owned("ReplicaSet", "web-a", "r1"))),
            },
        ];
        // The ReplicaSet's Deployment d1 is not among the remaining objects; the pod's
        // ReplicaSet is.
        let v = orphans(5, &remaining);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].object, "replicasets/chaos/web-a");
        assert!(v[0].evidence.contains("Deployment web (uid d1)"));
    }

    #[test]
    fn a_lost_acknowledged_write_is_reported() {
        let w = |rv, v: i64| AckedWrite {
            at_ms: rv * 10,
            object: "deployments/chaos/web".into(),
            field: "/spec/replicas".into(),
            value: json!(v),
            rv,
        };
        let acked = vec![w(5, 3), w(9, 4)];
        let mut finals = HashMap::new();
        finals.insert(
            "deployments/chaos/web".to_string(),
            json!({"spec": {"replicas": 4}}),
        );
        assert_eq!(lost_writes(1, &acked, &finals), vec![]);
        finals.insert(
            "deployments/chaos/web".to_string(),
            json!({"spec": {"replicas": 3}}),
        );
        let v = lost_writes(1, &acked, &finals);
        assert_eq!(v.len(), 1);
        assert!(v[0]
            .evidence
            .contains("acknowledged as 4 at resourceVersion 9"));
        assert_eq!(lost_writes(1, &acked, &HashMap::new()).len(), 1);
    }

    fn lease(holder: &str, transitions: i64) -> Value {
        json!({"metadata": {"namespace": "kube-system", "name": "kube-controller-manager", "uid": "l"},
               "spec": {"holderIdentity": holder, "leaseTransitions": transitions}})
    }

    #[test]
    fn two_leaders_in_one_term_are_reported() {
        let mut s = Stream::default();
        s.start(&["leases"]);
        s.event("leases", Kind::Added, lease("cm-0", 0));
        s.event("leases", Kind::Modified, lease("cm-0", 0));
        s.event("leases", Kind::Modified, lease("cm-1", 1));
        assert_eq!(leader_terms(&s.events), vec![]);
        // cm-0 wakes from a freeze and writes itself in as holder of term 1.
        s.event("leases", Kind::Modified, lease("cm-0", 1));
        let v = leader_terms(&s.events);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0]
            .evidence
            .contains("term 1 held by cm-1 and then by cm-0"));
        s.event("leases", Kind::Modified, lease("cm-1", 0));
        assert!(leader_terms(&s.events)[1]
            .evidence
            .contains("went back from 1 to 0"));
    }

    #[test]
    fn resource_versions_going_back_are_reported() {
        let mut s = Stream::default();
        s.start(&["pods"]);
        let o = owned("ReplicaSet", "web-a", "r1");
        s.event("pods", Kind::Added, pod("p", "p1", o.clone()));
        s.event("pods", Kind::Modified, pod("p", "p1", o.clone()));
        assert_eq!(watch_order_and_gaps(&s.events), vec![]);
        // Watcher 1 is handed the older version again.
        let mut stale = s
            .events
            .iter()
            .find(|e| e.rv == 1 && e.watcher == "pods#1")
            .cloned()
            .unwrap();
        stale.kind = Kind::Modified;
        s.events.push(stale);
        let v = only(watch_order_and_gaps(&s.events), RV_ORDER);
        assert!(v.evidence.contains("pods#1 saw resourceVersion 1 after 2"));
    }

    #[test]
    fn a_missed_event_is_reported_unless_a_410_explains_it() {
        let o = owned("ReplicaSet", "web-a", "r1");
        let mut s = Stream::default();
        s.start(&["pods"]);
        s.event("pods", Kind::Added, pod("p", "p1", o.clone()));
        // Watcher 1 misses this one …
        s.event_for(&[0], "pods", Kind::Modified, pod("p", "p1", o.clone()));
        // … and carries on past it.
        s.event("pods", Kind::Added, pod("q", "q1", o.clone()));
        let v = only(watch_order_and_gaps(&s.events), RV_GAP);
        assert!(v.evidence.contains("pods#1") && v.evidence.contains("resourceVersion 2"));

        // The same miss, but watcher 1's watch ended with 410 and it relisted.
        let mut s = Stream::default();
        s.start(&["pods"]);
        s.event("pods", Kind::Added, pod("p", "p1", o.clone()));
        s.events.push(Observed {
            at_ms: 15,
            watcher: "pods#1".into(),
            resource: "pods".into(),
            kind: Kind::Gone,
            rv: 0,
            object: None,
        });
        s.event_for(&[0], "pods", Kind::Modified, pod("p", "p1", o.clone()));
        let relist = s.rv;
        s.events.push(Observed {
            at_ms: 25,
            watcher: "pods#1".into(),
            resource: "pods".into(),
            kind: Kind::ListStart,
            rv: relist,
            object: None,
        });
        s.event_for(&[1], "pods", Kind::Listed, pod("p", "p1", o.clone()));
        // (a Listed item carries the object's own version)
        s.events.last_mut().unwrap().rv = relist;
        s.event("pods", Kind::Added, pod("q", "q1", o));
        assert_eq!(watch_order_and_gaps(&s.events), vec![]);
    }
}
