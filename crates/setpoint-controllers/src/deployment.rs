//! The Deployment controller: rolls a Deployment's pod template out through ReplicaSets.
//!
//! Each distinct pod template gets a ReplicaSet named `<deployment>-<pod-template-hash>`
//! (pods themselves are the ReplicaSet controller's business). [`plan`] is the pure decision
//! — which ReplicaSet to create, how to scale each one, which to delete and what status to
//! report — and [`DeploymentController`] carries it out.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentCondition, DeploymentStatus, ReplicaSet, ReplicaSetSpec,
};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::Resource as _;
use serde_json::json;
use setpoint_api::replicas;
use setpoint_runtime::client::{Api, Client, DeleteParams, Patch, PatchParams, PostParams};
use setpoint_runtime::controller::{Action, Context, Controller, ReconcileError, Reconciler};
use setpoint_runtime::events::{EventRecorder, EventType, Reporter, ToObjectReference};
use setpoint_runtime::informer::{Scope, SharedInformers, Store};
use setpoint_runtime::{Object, ObjectKey};

/// The controller's name (work queue, metrics, logs, events).
pub const NAME: &str = "deployment";
/// The label (and name suffix) identifying a pod template.
pub const HASH_LABEL: &str = "pod-template-hash";
/// The revision annotation on ReplicaSets and Deployments.
pub const REVISION: &str = "deployment.kubernetes.io/revision";
/// The deployment's replicas when the ReplicaSet was last scaled.
pub const DESIRED_REPLICAS: &str = "deployment.kubernetes.io/desired-replicas";
/// The deployment's replicas plus surge when the ReplicaSet was last scaled.
pub const MAX_REPLICAS: &str = "deployment.kubernetes.io/max-replicas";
/// The change cause copied from the deployment.
pub const CHANGE_CAUSE: &str = "kubernetes.io/change-cause";

/// A change to an existing ReplicaSet.
#[derive(Clone, Debug, PartialEq)]
pub struct Update {
    pub name: String,
    /// The new `spec.replicas`.
    pub replicas: i32,
    /// Annotations to set.
    pub annotations: BTreeMap<String, String>,
}

/// What one pass over a Deployment should do.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// A ReplicaSet to create for the current template.
    pub create: Option<ReplicaSet>,
    /// Changes to existing ReplicaSets.
    pub updates: Vec<Update>,
    /// Old ReplicaSets to delete (beyond `revisionHistoryLimit`).
    pub delete: Vec<String>,
    /// The revision annotation the Deployment should carry, when it differs.
    pub revision: Option<String>,
    /// The status to write, when it differs.
    pub status: Option<DeploymentStatus>,
    /// `ScalingReplicaSet` event messages.
    pub events: Vec<String>,
    /// When to look again without any change (progress deadline).
    pub requeue: Option<Duration>,
}

/// A stable short hash of a pod template (and the collision count), rendered in the
/// alphabet Kubernetes uses for safe names (no vowels, no look-alike digits).
pub fn template_hash(template: &PodTemplateSpec, collision_count: Option<i32>) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut t = template.clone();
    if let Some(l) = t.metadata.as_mut().and_then(|m| m.labels.as_mut()) {
        l.remove(HASH_LABEL);
    }
    let canonical = serde_json::to_vec(&t).unwrap_or_default();
    // 32-bit FNV-1a.
    let mut h: u32 = 0x811c_9dc5;
    let mut feed = |bytes: &[u8]| {
        for b in bytes {
            h ^= u32::from(*b);
            h = h.wrapping_mul(0x0100_0193);
        }
    };
    feed(&canonical);
    if let Some(c) = collision_count {
        feed(&c.to_le_bytes());
    }
    h.to_string()
        .bytes()
        .map(|d| ALPHABET[usize::from(d) % ALPHABET.len()] as char)
        .collect()
}

/// The template without the `pod-template-hash` label, for comparing templates.
fn bare(t: Option<&PodTemplateSpec>) -> serde_json::Value {
    let mut t = t.cloned().unwrap_or_default();
    if let Some(m) = t.metadata.as_mut() {
        if let Some(l) = m.labels.as_mut() {
            l.remove(HASH_LABEL);
            if l.is_empty() {
                m.labels = None;
            }
        }
    }
    serde_json::to_value(t).unwrap_or_default()
}

fn resolve(v: Option<&IntOrString>, total: i32, round_up: bool, default: &str) -> i32 {
    match v
        .cloned()
        .unwrap_or_else(|| IntOrString::String(default.into()))
    {
        IntOrString::Int(i) => i.max(0),
        IntOrString::String(s) => {
            let p: i64 = s.trim_end_matches('%').parse().unwrap_or(0);
            let n = i64::from(total) * p;
            (if round_up { (n + 99) / 100 } else { n / 100 }) as i32
        }
    }
}

/// `(maxSurge, maxUnavailable)` resolved against the desired replicas; both 0 → 1 unavailable.
pub fn surge_and_unavailable(d: &Deployment) -> (i32, i32) {
    let spec = d.spec.as_ref();
    if is_recreate(d) {
        return (0, 0);
    }
    let replicas = desired(d);
    let ru = spec
        .and_then(|s| s.strategy.as_ref())
        .and_then(|s| s.rolling_update.as_ref());
    let surge = resolve(ru.and_then(|r| r.max_surge.as_ref()), replicas, true, "25%");
    let unavailable = resolve(
        ru.and_then(|r| r.max_unavailable.as_ref()),
        replicas,
        false,
        "25%",
    );
    if surge == 0 && unavailable == 0 {
        (0, 1)
    } else {
        (surge, unavailable)
    }
}

fn is_recreate(d: &Deployment) -> bool {
    d.spec
        .as_ref()
        .and_then(|s| s.strategy.as_ref())
        .and_then(|s| s.type_.as_deref())
        == Some("Recreate")
}

fn desired(d: &Deployment) -> i32 {
    replicas::or_default(d.spec.as_ref().and_then(|s| s.replicas))
}

fn spec_replicas(rs: &ReplicaSet) -> i32 {
    replicas::or_default(rs.spec.as_ref().and_then(|s| s.replicas))
}

fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

fn revision_of(rs: &ReplicaSet) -> i64 {
    annotation(&rs.metadata, REVISION)
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

fn status_of(rs: &ReplicaSet) -> (i32, i32, i32) {
    rs.status.as_ref().map_or((0, 0, 0), |s| {
        (
            s.replicas,
            s.ready_replicas.unwrap_or(0),
            s.available_replicas.unwrap_or(0),
        )
    })
}

fn secs(t: &Time) -> i64 {
    t.0.as_second()
}

/// The working view of one ReplicaSet during a pass.
#[derive(Clone, Debug)]
struct Rs {
    name: String,
    replicas: i32,
    /// Pods the ReplicaSet reports having (its status; may lag its spec either way).
    pods: i32,
    available: i32,
    annotations: BTreeMap<String, String>,
    changed: bool,
    created: i64,
    revision: i64,
}

fn condition(
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    now: &Time,
) -> DeploymentCondition {
    DeploymentCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message),
        last_update_time: Some(now.clone()),
        last_transition_time: Some(now.clone()),
    }
}

/// Sets `c` in `conds`, keeping the transition time when the status is unchanged and the
/// update time too when nothing at all changed.
fn set_condition(conds: &mut Vec<DeploymentCondition>, mut c: DeploymentCondition) {
    if let Some(old) = conds.iter().find(|o| o.type_ == c.type_) {
        if old.status == c.status {
            c.last_transition_time = old.last_transition_time.clone();
            if old.reason == c.reason && old.message == c.message {
                c.last_update_time = old.last_update_time.clone();
            }
        }
    }
    conds.retain(|o| o.type_ != c.type_);
    conds.push(c);
}

/// The pure decision for one Deployment given the ReplicaSets it controls, at `now`.
pub fn plan(d: &Deployment, rses: &[ReplicaSet], now: &Time) -> Plan {
    let mut out = Plan::default();
    let name = d.metadata.name.clone().unwrap_or_default();
    let spec = d.spec.clone().unwrap_or_default();
    let replicas = desired(d);
    let (surge, max_unavailable) = surge_and_unavailable(d);
    let paused = spec.paused.unwrap_or(false);
    let old_status = d.status.clone().unwrap_or_default();
    let mut collision_count = old_status.collision_count;

    let wanted = bare(Some(&spec.template));
    let mut views: Vec<Rs> = rses
        .iter()
        .map(|rs| Rs {
            name: rs.metadata.name.clone().unwrap_or_default(),
            replicas: spec_replicas(rs),
            pods: status_of(rs).0,
            available: status_of(rs).2,
            annotations: rs.metadata.annotations.clone().unwrap_or_default(),
            changed: false,
            created: rs.metadata.creation_timestamp.as_ref().map_or(0, secs),
            revision: revision_of(rs),
        })
        .collect();
    // Oldest first.
    let mut order: Vec<usize> = (0..views.len()).collect();
    order.sort_by_key(|&i| (views[i].created, views[i].revision, views[i].name.clone()));

    let mut new_idx = order
        .iter()
        .copied()
        .find(|&i| bare(rses[i].spec.as_ref().and_then(|s| s.template.as_ref())) == wanted);
    let max_old_revision = views
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != new_idx)
        .map(|(_, v)| v.revision)
        .max()
        .unwrap_or(0);
    let new_revision = (max_old_revision + 1).to_string();
    let mut progress_reason: Option<(&str, String)> = None;

    // The ReplicaSet for the current template: reuse, or create (not while paused).
    let mut created = false;
    if let Some(i) = new_idx {
        let v = &mut views[i];
        if v.revision <= max_old_revision {
            v.annotations.insert(REVISION.into(), new_revision.clone());
            v.revision = max_old_revision + 1;
            v.changed = true;
        }
        if let Some(cc) = annotation(&d.metadata, CHANGE_CAUSE) {
            if v.annotations.get(CHANGE_CAUSE).map(String::as_str) != Some(cc) {
                v.annotations.insert(CHANGE_CAUSE.into(), cc.into());
                v.changed = true;
            }
        }
        if old_status
            .conditions
            .as_ref()
            .is_none_or(|c| !c.iter().any(|c| c.type_ == "Progressing"))
        {
            progress_reason = Some((
                "FoundNewReplicaSet",
                format!("Found new replica set \"{}\"", v.name),
            ));
        }
    } else if !paused {
        let mut hash = template_hash(&spec.template, collision_count);
        let mut rs_name = format!("{name}-{hash}");
        if views.iter().any(|v| v.name == rs_name) {
            // Same name, different template: a collision.
            collision_count = Some(collision_count.unwrap_or(0) + 1);
            hash = template_hash(&spec.template, collision_count);
            rs_name = format!("{name}-{hash}");
        }
        if !views.iter().any(|v| v.name == rs_name) {
            let mut annotations = BTreeMap::new();
            annotations.insert(REVISION.to_string(), new_revision.clone());
            if let Some(cc) = annotation(&d.metadata, CHANGE_CAUSE) {
                annotations.insert(CHANGE_CAUSE.into(), cc.into());
            }
            views.push(Rs {
                name: rs_name.clone(),
                replicas: 0,
                pods: 0,
                available: 0,
                annotations,
                changed: true,
                created: i64::MAX,
                revision: max_old_revision + 1,
            });
            new_idx = Some(views.len() - 1);
            order.push(views.len() - 1);
            created = true;
            progress_reason = Some((
                "NewReplicaSetCreated",
                format!("Created new replica set \"{rs_name}\""),
            ));
        }
    }
    let olds: Vec<usize> = order
        .iter()
        .copied()
        .filter(|&i| Some(i) != new_idx)
        .collect();
    let mut scaled = false;

    let total = |views: &[Rs]| views.iter().map(|v| v.replicas).sum::<i32>();
    // Pods that may exist: an old ReplicaSet scaled down still has its pods until its
    // controller deletes them, so the surge is measured against whichever is larger.
    let occupied = |views: &[Rs]| views.iter().map(|v| v.replicas.max(v.pods)).sum::<i32>();
    let set = |v: &mut Rs, n: i32, events: &mut Vec<String>| {
        if v.replicas != n {
            let dir = if n > v.replicas { "up" } else { "down" };
            events.push(format!(
                "Scaled {dir} replica set {} from {} to {n}",
                v.name, v.replicas
            ));
            v.replicas = n;
            v.changed = true;
        }
    };

    // A change of `spec.replicas` while several ReplicaSets are active: scale them
    // proportionally instead of making rollout progress.
    let active: Vec<usize> = order
        .iter()
        .copied()
        .filter(|&i| views[i].replicas > 0)
        .collect();
    let scaling_event = active.iter().any(|&i| {
        views[i]
            .annotations
            .get(DESIRED_REPLICAS)
            .and_then(|r| r.parse::<i32>().ok())
            .is_some_and(|r| r != replicas)
    });
    let mut events = Vec::new();
    if scaling_event && active.len() > 1 && !is_recreate(d) {
        let allowed = replicas + surge;
        let to_add = allowed - total(&views);
        if to_add != 0 {
            let mut by_size = active.clone();
            // Biggest first (newer first among equals when growing, older first when
            // shrinking); the rounding leftover goes to the first.
            let sign = if to_add > 0 { -1 } else { 1 };
            by_size.sort_by_key(|&i| (-views[i].replicas, sign * views[i].created));
            let mut added = 0;
            let mut sizes: BTreeMap<usize, i32> = BTreeMap::new();
            for &i in &by_size {
                let v = &views[i];
                let was = v
                    .annotations
                    .get(DESIRED_REPLICAS)
                    .and_then(|r| r.parse::<i32>().ok())
                    .filter(|r| *r > 0)
                    .unwrap_or(replicas.max(1));
                let target =
                    (f64::from(v.replicas) * f64::from(replicas) / f64::from(was)).round() as i32;
                let mut delta = target - v.replicas;
                let remaining = to_add - added;
                delta = if to_add > 0 {
                    delta.clamp(0, remaining)
                } else {
                    delta.clamp(remaining, 0)
                };
                added += delta;
                sizes.insert(i, v.replicas + delta);
            }
            if let Some(&first) = by_size.first() {
                let s = sizes.entry(first).or_default();
                *s = (*s + to_add - added).max(0);
            }
            for (i, n) in sizes {
                set(&mut views[i], n, &mut events);
            }
            scaled = true;
        }
    }

    if !scaled {
        if paused {
            // No rollout, only scaling: a lone active (or the new) ReplicaSet follows
            // `replicas`.
            if active.len() <= 1 {
                if let Some(t) = active.first().copied().or(new_idx) {
                    set(&mut views[t], replicas, &mut events);
                }
            }
        } else if let Some(n) = new_idx {
            if is_recreate(d) {
                let mut olds_running = false;
                for &i in &olds {
                    set(&mut views[i], 0, &mut events);
                    let (pods, _, _) = rses.get(i).map(status_of).unwrap_or_default();
                    olds_running |= pods > 0;
                }
                if !olds_running {
                    set(&mut views[n], replicas, &mut events);
                }
            } else {
                // Scale the new ReplicaSet up within the surge.
                let cur = views[n].replicas;
                if cur > replicas {
                    set(&mut views[n], replicas, &mut events);
                } else if cur < replicas {
                    let room = replicas + surge - occupied(&views);
                    if room > 0 {
                        let to = cur + room.min(replicas - cur);
                        set(&mut views[n], to, &mut events);
                    }
                }
                // Scale old ReplicaSets down, keeping enough available.
                let min_available = replicas - max_unavailable;
                let new_unavailable = (views[n].replicas - views[n].available).max(0);
                let mut budget = total(&views) - min_available - new_unavailable;
                // First, unavailable old replicas cost nothing to remove.
                for &i in &olds {
                    if budget <= 0 {
                        break;
                    }
                    let unhealthy = (views[i].replicas - views[i].available).max(0);
                    let cut = unhealthy.min(budget);
                    if cut > 0 {
                        let to = views[i].replicas - cut;
                        set(&mut views[i], to, &mut events);
                        budget -= cut;
                    }
                }
                // Then available ones, as far as availability allows.
                let available: i32 = views.iter().map(|v| v.available.min(v.replicas)).sum();
                let mut can = (available - min_available).min(budget.max(0));
                for &i in &olds {
                    if can <= 0 {
                        break;
                    }
                    let cut = views[i].replicas.min(can);
                    if cut > 0 {
                        let to = views[i].replicas - cut;
                        set(&mut views[i], to, &mut events);
                        can -= cut;
                    }
                }
            }
        }
    }
    out.events = events;

    // Bookkeeping annotations on every ReplicaSet with replicas, and on the new one.
    for (i, v) in views.iter_mut().enumerate() {
        if v.replicas > 0 || Some(i) == new_idx {
            for (k, val) in [
                (DESIRED_REPLICAS, replicas),
                (MAX_REPLICAS, replicas + surge),
            ] {
                let val = val.to_string();
                if v.annotations.get(k) != Some(&val) {
                    v.annotations.insert(k.into(), val);
                    v.changed = true;
                }
            }
        }
    }

    // History: delete the oldest idle old ReplicaSets beyond the limit.
    if let Some(limit) = spec.revision_history_limit {
        let idle: Vec<usize> = olds
            .iter()
            .copied()
            .filter(|&i| views[i].replicas == 0 && status_of(&rses[i]).0 == 0)
            .collect();
        let excess = idle.len().saturating_sub(limit.max(0) as usize);
        for &i in idle.iter().take(excess) {
            out.delete.push(views[i].name.clone());
        }
    }

    for (i, v) in views.iter().enumerate() {
        if created && Some(i) == new_idx {
            continue;
        }
        if v.changed && !out.delete.contains(&v.name) {
            out.updates.push(Update {
                name: v.name.clone(),
                replicas: v.replicas,
                annotations: v.annotations.clone(),
            });
        }
    }
    if created {
        let n = &views[new_idx.unwrap_or_default()];
        out.create = Some(new_replica_set(d, n, &collision_count));
    }
    if let Some(n) = new_idx {
        let rev = views[n].revision.to_string();
        if annotation(&d.metadata, REVISION) != Some(rev.as_str()) {
            out.revision = Some(rev);
        }
    }
    if !out.events.is_empty() && progress_reason.is_none() {
        if let Some(n) = new_idx {
            progress_reason = Some((
                "ReplicaSetUpdated",
                format!("ReplicaSet \"{}\" is progressing.", views[n].name),
            ));
        }
    }

    // Status, from what the ReplicaSets report.
    let mut st = DeploymentStatus {
        observed_generation: d.metadata.generation,
        collision_count,
        conditions: old_status.conditions.clone(),
        ..Default::default()
    };
    let (mut pods, mut ready, mut available) = (0, 0, 0);
    for rs in rses {
        let (p, r, a) = status_of(rs);
        pods += p;
        ready += r;
        available += a;
    }
    let updated = new_idx
        .and_then(|n| rses.get(n))
        .map_or(0, |rs| status_of(rs).0);
    st.replicas = Some(pods);
    st.updated_replicas = Some(updated);
    st.ready_replicas = Some(ready);
    st.available_replicas = Some(available);
    // As Kubernetes counts it: the ReplicaSets' desired pods not yet available.
    st.unavailable_replicas = Some((total(&views) - available).max(0));
    let mut conds = st.conditions.take().unwrap_or_default();
    let min_available = replicas - max_unavailable;
    set_condition(
        &mut conds,
        if available >= min_available {
            condition(
                "Available",
                "True",
                "MinimumReplicasAvailable",
                "Deployment has minimum availability.".into(),
                now,
            )
        } else {
            condition(
                "Available",
                "False",
                "MinimumReplicasUnavailable",
                "Deployment does not have minimum availability.".into(),
                now,
            )
        },
    );
    let new_name = new_idx.map(|n| views[n].name.clone()).unwrap_or_default();
    let complete = new_idx.is_some()
        && updated == replicas
        && pods == replicas
        && available == replicas
        && new_idx.is_some_and(|n| views[n].replicas == replicas)
        && olds.iter().all(|&i| views[i].replicas == 0);
    let deadline = spec.progress_deadline_seconds.unwrap_or(600);
    let progressed = progress_reason.is_some()
        || old_status.replicas != st.replicas
        || old_status.updated_replicas != st.updated_replicas
        || old_status.ready_replicas != st.ready_replicas
        || old_status.available_replicas != st.available_replicas;
    if paused {
        set_condition(
            &mut conds,
            condition(
                "Progressing",
                "Unknown",
                "DeploymentPaused",
                "Deployment is paused".into(),
                now,
            ),
        );
    } else if complete {
        set_condition(
            &mut conds,
            condition(
                "Progressing",
                "True",
                "NewReplicaSetAvailable",
                format!("ReplicaSet \"{new_name}\" has successfully progressed."),
                now,
            ),
        );
    } else {
        let current = conds.iter().find(|c| c.type_ == "Progressing").cloned();
        let was_paused = current
            .as_ref()
            .is_some_and(|c| c.reason.as_deref() == Some("DeploymentPaused"));
        let exceeded = current
            .as_ref()
            .is_some_and(|c| c.reason.as_deref() == Some("ProgressDeadlineExceeded"));
        if progressed || was_paused || current.is_none() {
            let (reason, message) = progress_reason.unwrap_or((
                "ReplicaSetUpdated",
                format!("ReplicaSet \"{new_name}\" is progressing."),
            ));
            let mut c = condition("Progressing", "True", reason, message, now);
            if let Some(o) = current.as_ref().filter(|o| o.status == "True") {
                c.last_transition_time = o.last_transition_time.clone();
            }
            conds.retain(|o| o.type_ != "Progressing");
            conds.push(c);
            out.requeue = Some(Duration::from_secs(deadline.max(0) as u64));
        } else if !exceeded {
            let since = current
                .as_ref()
                .and_then(|c| c.last_update_time.as_ref())
                .map_or(secs(now), secs);
            let left = since + i64::from(deadline) - secs(now);
            if left <= 0 {
                set_condition(
                    &mut conds,
                    condition(
                        "Progressing",
                        "False",
                        "ProgressDeadlineExceeded",
                        format!("ReplicaSet \"{new_name}\" has timed out progressing."),
                        now,
                    ),
                );
            } else {
                out.requeue = Some(Duration::from_secs(left as u64));
            }
        }
    }
    conds.sort_by_key(|c| if c.type_ == "Available" { 0 } else { 1 });
    st.conditions = Some(conds);
    if Some(&st) != d.status.as_ref() {
        out.status = Some(st);
    }
    out
}

fn new_replica_set(d: &Deployment, v: &Rs, collision_count: &Option<i32>) -> ReplicaSet {
    let spec = d.spec.clone().unwrap_or_default();
    let hash = template_hash(&spec.template, *collision_count);
    let mut template = spec.template.clone();
    let meta = template.metadata.get_or_insert_with(Default::default);
    meta.labels
        .get_or_insert_with(Default::default)
        .insert(HASH_LABEL.into(), hash.clone());
    let mut selector = spec.selector.clone();
    selector
        .match_labels
        .get_or_insert_with(Default::default)
        .insert(HASH_LABEL.into(), hash.clone());
    let mut labels = spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    labels.insert(HASH_LABEL.into(), hash);
    ReplicaSet {
        metadata: ObjectMeta {
            name: Some(v.name.clone()),
            namespace: d.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: Some(v.annotations.clone()),
            owner_references: Some(vec![owner_reference(d)]),
            ..Default::default()
        },
        spec: Some(ReplicaSetSpec {
            replicas: Some(v.replicas),
            min_ready_seconds: spec.min_ready_seconds,
            selector,
            template: Some(template),
        }),
        status: None,
    }
}

fn owner_reference(d: &Deployment) -> OwnerReference {
    OwnerReference {
        api_version: Deployment::API_VERSION.into(),
        kind: Deployment::KIND.into(),
        name: d.metadata.name.clone().unwrap_or_default(),
        uid: d.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Whether the deployment's selector matches these labels (`matchLabels` and the
/// `matchExpressions` operators).
fn selects(d: &Deployment, labels: &BTreeMap<String, String>) -> bool {
    let Some(sel) = d.spec.as_ref().map(|s| &s.selector) else {
        return false;
    };
    let labels_ok = sel.match_labels.as_ref().is_some_and(|m| !m.is_empty())
        || sel
            .match_expressions
            .as_ref()
            .is_some_and(|e| !e.is_empty());
    labels_ok
        && sel
            .match_labels
            .iter()
            .flatten()
            .all(|(k, v)| labels.get(k) == Some(v))
        && sel.match_expressions.iter().flatten().all(|e| {
            let vals = e.values.clone().unwrap_or_default();
            match e.operator.as_str() {
                "In" => labels.get(&e.key).is_some_and(|v| vals.contains(v)),
                "NotIn" => labels.get(&e.key).is_none_or(|v| !vals.contains(v)),
                "Exists" => labels.contains_key(&e.key),
                "DoesNotExist" => !labels.contains_key(&e.key),
                _ => false,
            }
        })
}

/// The field manager of the controller's writes, as Kubernetes names it.
pub const FIELD_MANAGER: &str = "kube-controller-manager";

fn write_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

/// The reconciler of Deployments.
pub struct DeploymentController {
    client: Client,
    deployments: Store<Deployment>,
    replica_sets: Store<ReplicaSet>,
    events: EventRecorder,
}

#[async_trait::async_trait]
impl Reconciler for DeploymentController {
    async fn reconcile(&self, _ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(d) = self.deployments.get(key) else {
            return Ok(Action::Done);
        };
        if d.metadata.deletion_timestamp.is_some() {
            return Ok(Action::Done);
        }
        let ns = d.metadata.namespace.clone().unwrap_or_default();
        let uid = d.metadata.uid.clone().unwrap_or_default();
        let rs_api: Api<ReplicaSet> = Api::namespaced(self.client.clone(), &ns);
        let mut owned: Vec<ReplicaSet> = self
            .replica_sets
            .by_owner(&uid)
            .iter()
            .filter(|rs| {
                rs.metadata.deletion_timestamp.is_none()
                    && rs
                        .metadata
                        .owner_references
                        .iter()
                        .flatten()
                        .any(|r| r.uid == uid && r.controller == Some(true))
            })
            .map(|rs| (**rs).clone())
            .collect();
        // Adopt matching orphans.
        for rs in self.replica_sets.orphans_in(&ns) {
            let orphan = !rs
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|r| r.controller == Some(true));
            if orphan
                && rs.metadata.deletion_timestamp.is_none()
                && selects(&d, &rs.metadata.labels.clone().unwrap_or_default())
            {
                let mut refs = rs.metadata.owner_references.clone().unwrap_or_default();
                refs.push(owner_reference(&d));
                let patch = json!({"metadata": {
                    "ownerReferences": refs,
                    "resourceVersion": rs.metadata.resource_version,
                }});
                match rs_api
                    .patch(&rs.name(), &write_params(), &Patch::Merge(patch))
                    .await
                {
                    Ok(adopted) => owned.push(adopted),
                    Err(e) if e.is_not_found() || e.is_conflict() => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        let now = Time(crate::now());
        let p = plan(&d, &owned, &now);
        let reference = d.object_reference();
        let dapi: Api<Deployment> = Api::namespaced(self.client.clone(), &ns);
        if let Some(rs) = &p.create {
            match rs_api
                .create(
                    &PostParams {
                        field_manager: Some(FIELD_MANAGER.into()),
                        ..Default::default()
                    },
                    rs,
                )
                .await
            {
                Ok(_) => {}
                Err(e) if e.is_already_exists() => {
                    // Ours with this template (the cache is behind): just look again.
                    let name = rs.metadata.name.clone().unwrap_or_default();
                    if let Some(existing) = rs_api.get_opt(&name).await? {
                        let ours = existing
                            .metadata
                            .owner_references
                            .iter()
                            .flatten()
                            .any(|r| r.uid == uid && r.controller == Some(true));
                        let same = bare(existing.spec.as_ref().and_then(|s| s.template.as_ref()))
                            == bare(rs.spec.as_ref().and_then(|s| s.template.as_ref()));
                        if ours && same {
                            return Ok(Action::RequeueAfter(Duration::from_millis(100)));
                        }
                    }
                    // Another ReplicaSet holds the name: bump the collision count.
                    let count = d
                        .status
                        .as_ref()
                        .and_then(|s| s.collision_count)
                        .unwrap_or(0)
                        + 1;
                    dapi.patch_status(
                        &d.name(),
                        &write_params(),
                        &Patch::Merge(json!({"status": {"collisionCount": count}})),
                    )
                    .await?;
                    // The status write's own event brings the Deployment back.
                    return Ok(Action::Done);
                }
                Err(e) => return Err(e.into()),
            }
        }
        for u in &p.updates {
            let patch = json!({
                "metadata": {"annotations": u.annotations},
                "spec": {"replicas": u.replicas},
            });
            match rs_api
                .patch(&u.name, &write_params(), &Patch::Merge(patch))
                .await
            {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        for m in &p.events {
            self.events
                .publish(&reference, EventType::Normal, "ScalingReplicaSet", m);
        }
        for name in &p.delete {
            match rs_api.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        let mut resource_version = d.metadata.resource_version.clone();
        if let Some(rev) = &p.revision {
            let patched = dapi
                .patch(
                    &d.name(),
                    &write_params(),
                    &Patch::Merge(json!({"metadata": {
                        "annotations": {REVISION: rev},
                        "resourceVersion": resource_version,
                    }})),
                )
                .await?;
            resource_version = patched.metadata.resource_version;
        }
        if let Some(st) = &p.status {
            match dapi
                .patch_status(
                    &d.name(),
                    &write_params(),
                    // Guarded by the resourceVersion: conditions written by others since the
                    // cache was filled must not be lost.
                    &Patch::Merge(json!({
                        "metadata": {"resourceVersion": resource_version},
                        "status": st,
                    })),
                )
                .await
            {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                // Changed meanwhile: the newer version's event queues this key again. Asking
                // for an immediate retry instead would spin on the stale cache until it
                // catches up — and a loaded server's caches lag most.
                Err(e) if e.is_conflict() => return Ok(Action::Done),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(match p.requeue {
            Some(d) => Action::RequeueAfter(d),
            None => Action::Done,
        })
    }
}

/// Builds the Deployment controller.
pub fn controller(client: Client, informers: &SharedInformers) -> Controller {
    let reconciler = DeploymentController {
        events: EventRecorder::new(client.clone(), Reporter::new("deployment-controller")),
        client,
        deployments: informers.typed::<Deployment>(Scope::all()).store(),
        replica_sets: informers.typed::<ReplicaSet>(Scope::all()).store(),
    };
    Controller::for_type::<Deployment>(NAME, informers, None)
        .owns::<Deployment, ReplicaSet>(None)
        .build(Arc::new(reconciler))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::ReplicaSetStatus;
    use proptest::prelude::*;

    fn at(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + s).unwrap())
    }

    fn deployment(replicas: i32, image: &str, strategy: serde_json::Value) -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": "app", "namespace": "default", "uid": "d-uid", "generation": 1},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": "app"}},
                "strategy": strategy,
                "template": {
                    "metadata": {"labels": {"app": "app"}},
                    "spec": {"containers": [{"name": "c", "image": image}]}
                }
            }
        }))
        .unwrap()
    }

    fn rolling(surge: serde_json::Value, unavailable: serde_json::Value) -> serde_json::Value {
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}})
    }

    /// The cluster as the test model sees it: ReplicaSets whose pods appear at once and become
    /// available when the model says so.
    #[derive(Default)]
    struct Model {
        rses: Vec<ReplicaSet>,
        clock: i64,
    }

    impl Model {
        fn apply(&mut self, d: &mut Deployment, p: &Plan) {
            self.clock += 1;
            if let Some(rs) = &p.create {
                let mut rs = rs.clone();
                rs.metadata.creation_timestamp = Some(at(self.clock));
                rs.status = Some(ReplicaSetStatus::default());
                self.rses.push(rs);
            }
            for u in &p.updates {
                let rs = self
                    .rses
                    .iter_mut()
                    .find(|r| r.metadata.name.as_deref() == Some(&u.name))
                    .unwrap();
                rs.spec.as_mut().unwrap().replicas = Some(u.replicas);
                rs.metadata.annotations = Some(u.annotations.clone());
            }
            self.rses
                .retain(|r| !p.delete.contains(r.metadata.name.as_ref().unwrap()));
            if let Some(r) = &p.revision {
                d.metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(REVISION.into(), r.clone());
            }
            if let Some(s) = &p.status {
                d.status = Some(s.clone());
            }
            // The ReplicaSet controller: pods follow spec at once, unavailable ones go first.
            for rs in &mut self.rses {
                let want = spec_replicas(rs);
                let st = rs.status.get_or_insert_with(Default::default);
                st.replicas = want;
                let a = st.available_replicas.unwrap_or(0).min(want);
                st.available_replicas = Some(a);
                st.ready_replicas = Some(a);
            }
        }

        /// Makes up to `n` pods of each ReplicaSet available.
        fn ready(&mut self, n: i32) {
            for rs in &mut self.rses {
                let st = rs.status.get_or_insert_with(Default::default);
                let a = (st.available_replicas.unwrap_or(0) + n).min(st.replicas);
                st.available_replicas = Some(a);
                st.ready_replicas = Some(a);
            }
        }

        fn available(&self) -> i32 {
            self.rses.iter().map(|r| status_of(r).2).sum()
        }

        fn total(&self) -> i32 {
            self.rses.iter().map(spec_replicas).sum()
        }

        fn by_rev(&self, rev: &str) -> &ReplicaSet {
            self.rses
                .iter()
                .find(|r| annotation(&r.metadata, REVISION) == Some(rev))
                .unwrap()
        }

        fn step(&mut self, d: &mut Deployment) -> Plan {
            let p = plan(d, &self.rses, &at(self.clock));
            self.apply(d, &p);
            p
        }

        fn settle(&mut self, d: &mut Deployment) {
            for _ in 0..100 {
                self.step(d);
                self.ready(100);
            }
        }
    }

    fn progressing(d: &Deployment) -> DeploymentCondition {
        d.status
            .as_ref()
            .unwrap()
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "Progressing")
            .unwrap()
            .clone()
    }

    fn set_image(d: &mut Deployment, image: &str) {
        d.spec
            .as_mut()
            .unwrap()
            .template
            .spec
            .as_mut()
            .unwrap()
            .containers[0]
            .image = Some(image.into());
        d.metadata.generation = Some(d.metadata.generation.unwrap() + 1);
    }

    #[test]
    fn a_replica_set_without_replicas_has_one_as_in_its_own_controller() {
        let rs = ReplicaSet {
            spec: Some(Default::default()),
            ..Default::default()
        };
        assert_eq!(spec_replicas(&rs), 1);
        assert_eq!(spec_replicas(&ReplicaSet::default()), 1);
    }

    #[test]
    fn hash_is_stable_short_and_safe() {
        let d = deployment(1, "a", json!({}));
        let t = &d.spec.as_ref().unwrap().template;
        let h = template_hash(t, None);
        assert_eq!(h, template_hash(t, None));
        assert!(
            h.len() <= 10
                && h.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        );
        assert_ne!(h, template_hash(t, Some(1)));
        let other = deployment(1, "b", json!({}));
        assert_ne!(
            h,
            template_hash(&other.spec.as_ref().unwrap().template, None)
        );
    }

    #[test]
    fn surge_and_unavailable_round_as_kubernetes_does() {
        let d = deployment(10, "a", rolling(json!("25%"), json!("25%")));
        assert_eq!(surge_and_unavailable(&d), (3, 2));
        let d = deployment(3, "a", rolling(json!(0), json!(0)));
        assert_eq!(surge_and_unavailable(&d), (0, 1));
        let d = deployment(3, "a", rolling(json!(1), json!(0)));
        assert_eq!(surge_and_unavailable(&d), (1, 0));
    }

    #[test]
    fn first_pass_creates_a_labelled_owned_replica_set() {
        let d = deployment(3, "a", json!({}));
        let p = plan(&d, &[], &at(0));
        let rs = p.create.unwrap();
        let hash = template_hash(&d.spec.as_ref().unwrap().template, None);
        assert_eq!(
            rs.metadata.name.as_deref(),
            Some(format!("app-{hash}").as_str())
        );
        assert_eq!(rs.metadata.labels.as_ref().unwrap()[HASH_LABEL], hash);
        let spec = rs.spec.as_ref().unwrap();
        assert_eq!(
            spec.selector.match_labels.as_ref().unwrap()[HASH_LABEL],
            hash
        );
        let tl = spec.template.as_ref().unwrap().metadata.as_ref().unwrap();
        assert_eq!(tl.labels.as_ref().unwrap()[HASH_LABEL], hash);
        assert_eq!(spec.replicas, Some(3));
        let a = rs.metadata.annotations.as_ref().unwrap();
        assert_eq!(a[REVISION], "1");
        assert_eq!(a[DESIRED_REPLICAS], "3");
        assert_eq!(a[MAX_REPLICAS], "4");
        let owner = &rs.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.uid.as_str(), owner.controller),
            ("d-uid", Some(true))
        );
        assert_eq!(p.revision.as_deref(), Some("1"));
        assert_eq!(
            progressing(&Deployment {
                status: p.status,
                ..d
            })
            .reason
            .as_deref(),
            Some("NewReplicaSetCreated")
        );
    }

    #[test]
    fn rolling_update_respects_surge_and_completes() {
        let mut d = deployment(3, "a", rolling(json!(1), json!(0)));
        let mut m = Model::default();
        m.settle(&mut d);
        assert_eq!(
            progressing(&d).reason.as_deref(),
            Some("NewReplicaSetAvailable")
        );
        set_image(&mut d, "b");
        let p = m.step(&mut d);
        assert!(p.create.is_some());
        assert_eq!(m.total(), 4);
        assert_eq!(m.by_rev("1").spec.as_ref().unwrap().replicas, Some(3));
        m.step(&mut d);
        assert_eq!(
            m.total(),
            4,
            "nothing scales down before new pods are available"
        );
        m.ready(1);
        let p = m.step(&mut d);
        assert!(p
            .events
            .iter()
            .any(|e| e.starts_with("Scaled down replica set")));
        assert!(m.available() >= 3);
        m.settle(&mut d);
        assert_eq!(m.by_rev("1").spec.as_ref().unwrap().replicas, Some(0));
        assert_eq!(m.by_rev("2").spec.as_ref().unwrap().replicas, Some(3));
        let st = d.status.as_ref().unwrap();
        assert_eq!(st.observed_generation, Some(2));
        assert_eq!(
            (st.updated_replicas, st.available_replicas),
            (Some(3), Some(3))
        );
        assert_eq!(
            progressing(&d).reason.as_deref(),
            Some("NewReplicaSetAvailable")
        );
        assert_eq!(d.metadata.annotations.as_ref().unwrap()[REVISION], "2");
    }

    #[test]
    fn surge_counts_pods_an_old_replica_set_still_has() {
        let mut d = deployment(3, "a", rolling(json!(1), json!(0)));
        let mut m = Model::default();
        m.settle(&mut d);
        set_image(&mut d, "b");
        m.step(&mut d);
        m.ready(1);
        // The old ReplicaSet is scaled down to 2 in this pass...
        m.step(&mut d);
        assert_eq!(spec_replicas(m.by_rev("1")), 2);
        // ...but its controller has not removed the third pod yet.
        let old = m
            .rses
            .iter_mut()
            .find(|r| annotation(&r.metadata, REVISION) == Some("1"))
            .unwrap();
        old.status.as_mut().unwrap().replicas = 3;
        let new_before = spec_replicas(m.by_rev("2"));
        let p = plan(&d, &m.rses, &at(m.clock));
        let grown = p.updates.iter().any(|u| {
            u.name == m.by_rev("2").metadata.name.clone().unwrap() && u.replicas > new_before
        });
        assert!(!grown, "no new pod while 4 already exist: {:?}", p.updates);
    }

    #[test]
    fn rollback_reuses_the_old_replica_set_with_a_new_revision() {
        let mut d = deployment(2, "a", rolling(json!(1), json!(0)));
        let mut m = Model::default();
        m.settle(&mut d);
        set_image(&mut d, "b");
        m.settle(&mut d);
        set_image(&mut d, "a");
        m.settle(&mut d);
        assert_eq!(m.rses.len(), 2);
        let rs = m.by_rev("3");
        assert_eq!(spec_replicas(rs), 2);
        assert_eq!(
            rs.spec
                .as_ref()
                .unwrap()
                .template
                .as_ref()
                .unwrap()
                .spec
                .as_ref()
                .unwrap()
                .containers[0]
                .image
                .as_deref(),
            Some("a")
        );
        assert_eq!(spec_replicas(m.by_rev("2")), 0);
    }

    #[test]
    fn recreate_waits_for_old_pods_to_go() {
        let mut d = deployment(2, "a", json!({"type": "Recreate"}));
        let mut m = Model::default();
        m.settle(&mut d);
        set_image(&mut d, "b");
        // Old pods still running in the RS status: the new RS stays at 0.
        let p = plan(&d, &m.rses, &at(0));
        let created = p.create.as_ref().unwrap();
        assert_eq!(spec_replicas(created), 0);
        assert_eq!(p.updates[0].replicas, 0);
        m.settle(&mut d);
        assert_eq!(spec_replicas(m.by_rev("2")), 2);
        assert_eq!(spec_replicas(m.by_rev("1")), 0);
    }

    #[test]
    fn paused_makes_no_progress_but_scales() {
        let mut d = deployment(2, "a", rolling(json!(1), json!(0)));
        let mut m = Model::default();
        m.settle(&mut d);
        d.spec.as_mut().unwrap().paused = Some(true);
        set_image(&mut d, "b");
        m.settle(&mut d);
        assert_eq!(m.rses.len(), 1);
        assert_eq!(progressing(&d).reason.as_deref(), Some("DeploymentPaused"));
        d.spec.as_mut().unwrap().replicas = Some(4);
        m.settle(&mut d);
        assert_eq!(spec_replicas(m.by_rev("1")), 4);
        d.spec.as_mut().unwrap().paused = None;
        m.settle(&mut d);
        assert_eq!(spec_replicas(m.by_rev("2")), 4);
        assert_eq!(spec_replicas(m.by_rev("1")), 0);
    }

    #[test]
    fn history_limit_deletes_the_oldest_idle_replica_sets() {
        let mut d = deployment(1, "a", rolling(json!(1), json!(0)));
        d.spec.as_mut().unwrap().revision_history_limit = Some(1);
        let mut m = Model::default();
        for image in ["a", "b", "c", "d"] {
            set_image(&mut d, image);
            m.settle(&mut d);
        }
        assert_eq!(m.rses.len(), 2);
        assert_eq!(spec_replicas(m.by_rev("4")), 1);
        assert_eq!(spec_replicas(m.by_rev("3")), 0);
    }

    #[test]
    fn proportional_scaling_mid_rollout() {
        let mut d = deployment(10, "a", rolling(json!(3), json!(2)));
        let mut m = Model::default();
        m.settle(&mut d);
        set_image(&mut d, "b");
        m.step(&mut d);
        // new 3 (surge), old scaled to 8 (10 - 2 unavailable).
        assert_eq!(
            (spec_replicas(m.by_rev("2")), spec_replicas(m.by_rev("1"))),
            (3, 8)
        );
        d.spec.as_mut().unwrap().replicas = Some(20);
        let p = m.step(&mut d);
        assert!(!p.events.is_empty());
        // Scaled to 20 + 3 surge in proportion: 8 → 16 (+1 rounding leftover to the largest), 3 → 6.
        assert_eq!(m.total(), 20 + 3);
        assert_eq!(
            (spec_replicas(m.by_rev("2")), spec_replicas(m.by_rev("1"))),
            (6, 17)
        );
    }

    #[test]
    fn collision_bumps_the_count_and_rehashes() {
        let d = deployment(1, "a", json!({}));
        let hash = template_hash(&d.spec.as_ref().unwrap().template, None);
        let mut squatter = plan(&deployment(1, "zzz", json!({})), &[], &at(0))
            .create
            .unwrap();
        squatter.metadata.name = Some(format!("app-{hash}"));
        let p = plan(&d, &[squatter], &at(0));
        assert_eq!(p.status.as_ref().unwrap().collision_count, Some(1));
        let created = p.create.unwrap();
        assert_eq!(
            created.metadata.name.unwrap(),
            format!(
                "app-{}",
                template_hash(&d.spec.as_ref().unwrap().template, Some(1))
            )
        );
    }

    #[test]
    fn progress_deadline_is_reported_and_requeued() {
        let mut d = deployment(1, "a", rolling(json!(1), json!(0)));
        d.spec.as_mut().unwrap().progress_deadline_seconds = Some(30);
        let mut m = Model::default();
        m.step(&mut d);
        // Its pods appear: progress at t=1, and a fresh deadline.
        let p = m.step(&mut d);
        assert_eq!(p.requeue, Some(Duration::from_secs(30)));
        let p = plan(&d, &m.rses, &at(11));
        assert_eq!(p.requeue, Some(Duration::from_secs(20)));
        let p = plan(&d, &m.rses, &at(40));
        d.status = p.status;
        let c = progressing(&d);
        assert_eq!(
            (c.status.as_str(), c.reason.as_deref()),
            ("False", Some("ProgressDeadlineExceeded"))
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// Random readiness per step and random mid-rollout changes (replicas, pause,
        /// image): no pass takes the pods beyond `replicas + maxSurge` or availability below
        /// `replicas - maxUnavailable` (unless it was already lower), and once unpaused every
        /// rollout ends on the latest template with the old ReplicaSets at 0.
        #[test]
        fn rollouts_stay_within_bounds_and_finish(
            replicas in 1i32..8,
            surge in 0i32..3,
            unavailable in 0i32..3,
            readiness in proptest::collection::vec(0i32..3, 40),
            changes in proptest::collection::vec((0usize..40, 0u8..4, 1i32..8), 0..5),
        ) {
            let mut d = deployment(replicas, "v0", rolling(json!(surge), json!(unavailable)));
            let mut m = Model::default();
            m.settle(&mut d);
            let mut image = 0;
            for (step, ready) in readiness.iter().enumerate() {
                for (at_step, kind, n) in &changes {
                    if *at_step == step {
                        match kind {
                            0 => d.spec.as_mut().unwrap().replicas = Some(*n),
                            1 => {
                                let s = d.spec.as_mut().unwrap();
                                s.paused = Some(!s.paused.unwrap_or(false));
                            }
                            _ => { image += 1; set_image(&mut d, &format!("v{image}")); }
                        }
                    }
                }
                let want = desired(&d);
                let (s, u) = surge_and_unavailable(&d);
                let (total_before, avail_before) = (m.total(), m.available());
                m.step(&mut d);
                prop_assert!(m.total() <= (want + s).max(total_before),
                    "total {} > {} + {}", m.total(), want, s);
                prop_assert!(m.available() >= (want - u).min(avail_before),
                    "available {} < {} - {} (was {})", m.available(), want, u, avail_before);
                m.ready(*ready);
            }
            d.spec.as_mut().unwrap().paused = None;
            m.settle(&mut d);
            let img = format!("v{image}");
            let want = desired(&d);
            for rs in &m.rses {
                let t = rs.spec.as_ref().unwrap().template.as_ref().unwrap();
                let current = t.spec.as_ref().unwrap().containers[0].image.as_deref() == Some(img.as_str());
                prop_assert_eq!(spec_replicas(rs), if current { want } else { 0 });
            }
            let reason = progressing(&d).reason;
            prop_assert_eq!(reason.as_deref(), Some("NewReplicaSetAvailable"));
        }
    }
}
