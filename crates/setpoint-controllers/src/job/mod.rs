//! The Job controller: runs a Job's pods until `completions` of them succeed (for an Indexed
//! Job: one per index), at most `parallelism` at a time, giving up after `backoffLimit`
//! failed pods, past `activeDeadlineSeconds`, when a `podFailurePolicy` rule says so, or when
//! indexes exhaust `backoffLimitPerIndex`.
//!
//! Every pod carries the `batch.kubernetes.io/job-tracking` finalizer until its outcome is
//! in the Job's status ([`tracking`]): the counts live in the status, so they survive the
//! pods (pod GC, a user's delete), and each pass derives them from the stored status and the
//! pods the cache shows — nothing is accumulated in memory, and a restarted controller
//! reaches the same decision. A pod deleted before it finished counts as failed, unless the
//! Job replaces only failed pods. A failed pod is replaced after a
//! back-off of 10 s doubling per failure (capped at 6 min), as Kubernetes does (per index with
//! `backoffLimitPerIndex`).
//!
//! A Job ends in two steps, as upstream's does since 1.31: first the interim condition
//! (`FailureTarget` or `SuccessCriteriaMet`) is written and the remaining pods are deleted; the
//! terminal one (`Failed` or `Complete`, with the same reason and message) follows once no
//! pod of the Job is running or terminating.
//!
//! Pods are created as upstream creates them: at most [`MAX_POD_CREATE_DELETE_PER_SYNC`] per
//! sync, in slow-start batches (1, 2, 4 …) behind expectations, stopping at the first failed
//! create — and, before every batch, unless the Job still wants them ([`still_wants_pods`]),
//! so deleting a Job that asked for millions of pods stops its pods within one batch.
//!
//! [`plan`] is the pure decision; [`JobController`] does the I/O around it. [`indexes`] holds
//! what is particular to Indexed Jobs, [`policy`] the pod failure and success policies.

pub mod indexes;
pub mod policy;
pub mod tracking;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::{Job, JobCondition, JobStatus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;
use setpoint_api::selector::LabelSelector;
use setpoint_runtime::client::{Api, Client, DeleteParams, ListParams, PatchParams, PostParams};
use setpoint_runtime::controller::{Action, Context, Controller, ReconcileError, Reconciler};
use setpoint_runtime::events::{EventRecorder, EventType, Reporter, ToObjectReference};
use setpoint_runtime::informer::{Scope, SharedInformers, Store};
use setpoint_runtime::{Object, ObjectKey};

use self::indexes::{completion_index, Intervals};
use self::policy::{match_pod_failure_policy, match_success_policy, Action as PolicyAction};
use crate::expectations::{BatchesEnd, OwnedPods, Owner};

/// The controller's name (work queue, metrics, logs, event reporter).
pub const NAME: &str = "job";
/// The label upstream puts on a Job's pods naming it.
const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";
/// The older form of [`JOB_NAME_LABEL`], still set.
const LEGACY_JOB_NAME_LABEL: &str = "job-name";
const OWNER: Owner = Owner {
    group: "batch",
    kind: "Job",
};
/// The first delay before a failed pod is replaced.
pub const BACKOFF_BASE: Duration = Duration::from_secs(10);
/// The longest delay before a failed pod is replaced.
pub const BACKOFF_MAX: Duration = Duration::from_secs(360);
/// At most this many pods are created, or surplus pods deleted, in one sync (upstream's
/// `MaxPodCreateDeletePerSync`): a Job asking for millions of pods gets them 500 at a time,
/// each lot only once the previous one has been observed.
pub const MAX_POD_CREATE_DELETE_PER_SYNC: usize = 500;

/// How a Job ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finish {
    /// The terminal condition: `Complete` or `Failed`.
    pub condition: &'static str,
    /// The conditions' `reason`: `CompletionsReached`, `SuccessPolicy`, `PodFailurePolicy`,
    /// `BackoffLimitExceeded`, `DeadlineExceeded`, `FailedIndexes` or
    /// `MaxFailedIndexesExceeded`.
    pub reason: String,
    /// The conditions' human-readable `message`.
    pub message: String,
}

impl Finish {
    fn failed(reason: &str, message: impl Into<String>) -> Finish {
        Finish {
            condition: "Failed",
            reason: reason.into(),
            message: message.into(),
        }
    }

    fn complete(reason: &str, message: impl Into<String>) -> Finish {
        Finish {
            condition: "Complete",
            reason: reason.into(),
            message: message.into(),
        }
    }

    /// The interim condition written first: `FailureTarget` or `SuccessCriteriaMet`.
    pub fn target(&self) -> &'static str {
        if self.condition == "Failed" {
            "FailureTarget"
        } else {
            "SuccessCriteriaMet"
        }
    }
}

/// A pod to create for an Indexed Job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NewIndex {
    /// Its completion index.
    pub index: i32,
    /// The index's failures so far (with `backoffLimitPerIndex`), for its annotation.
    pub failures: Option<i32>,
}

/// What one pass over a Job should do.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Pods to create (for an Indexed Job, `indexes.len()`).
    pub create: usize,
    /// For an Indexed Job, the indexes of the pods to create, lowest first.
    pub indexes: Vec<NewIndex>,
    /// Active pods to delete (surplus, duplicates, or all of them once the Job is ending).
    pub delete: Vec<ObjectKey>,
    /// The counts the pods imply.
    pub active: i32,
    /// Succeeded pods counted (`status.succeeded`: pods moved out of the uncounted list; for
    /// an Indexed Job, succeeded indexes).
    pub succeeded: i32,
    /// Failed pods counted (`status.failed`): those a `podFailurePolicy` rule ignores are not.
    pub failed: i32,
    /// UIDs of succeeded pods recorded but not yet in `succeeded`
    /// (`status.uncountedTerminatedPods.succeeded`).
    pub uncounted_succeeded: BTreeSet<String>,
    /// UIDs of failed pods recorded but not yet in `failed`.
    pub uncounted_failed: BTreeSet<String>,
    /// Pods whose tracking finalizer can go now: their outcome is already in the stored
    /// status, counts for nothing, or the Job has ended.
    pub release: Vec<ObjectKey>,
    /// Pods whose outcome this plan's status records for the first time: their finalizer
    /// goes once that status is written, never before.
    pub release_after_write: Vec<ObjectKey>,
    /// Active pods whose `Ready` condition is `True` (`status.ready`).
    pub ready: i32,
    /// Pods being deleted that have not reached a terminal phase (`status.terminating`).
    pub terminating: i32,
    /// For an Indexed Job, the succeeded indexes (`status.completedIndexes`).
    pub completed_indexes: Option<Intervals>,
    /// With `backoffLimitPerIndex`, the failed indexes (`status.failedIndexes`).
    pub failed_indexes: Option<Intervals>,
    /// The Job is ending (its interim condition is written now, if not already).
    pub finish: Option<Finish>,
    /// The terminal condition of `finish` is written now: no pod runs or terminates any more.
    pub terminal: bool,
    /// Look again after this long (a back-off or deadline running out).
    pub requeue: Option<Duration>,
}

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

fn is_terminal(p: &Pod) -> bool {
    matches!(phase(p), "Succeeded" | "Failed")
}

fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// When a finished pod finished (its last container's termination), else when it was created.
fn finished_at(p: &Pod) -> Option<Timestamp> {
    let terminated = p
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref()?.finished_at.as_ref())
        .map(|t| t.0)
        .max();
    terminated.or_else(|| p.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// The condition of type `t` with status True, if the Job has it.
fn condition<'a>(job: &'a Job, t: &str) -> Option<&'a JobCondition> {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == t && c.status == "True"))
}

/// Whether the Job has ended (`Complete` or `Failed`).
pub fn is_finished(job: &Job) -> bool {
    condition(job, "Complete").is_some() || condition(job, "Failed").is_some()
}

/// Whether the Job has ended or is ending (`FailureTarget` or `SuccessCriteriaMet` written):
/// either way it wants no new pods.
pub fn is_ending(job: &Job) -> bool {
    is_finished(job)
        || condition(job, "FailureTarget").is_some()
        || condition(job, "SuccessCriteriaMet").is_some()
}

/// The delay before replacing a pod after `failures` failures.
pub fn backoff(failures: i32) -> Duration {
    if failures <= 0 {
        return Duration::ZERO;
    }
    let shift = (failures - 1).min(16) as u32;
    (BACKOFF_BASE * 2u32.pow(shift)).min(BACKOFF_MAX)
}

fn secs(d: i64) -> Duration {
    Duration::from_secs(d.max(0) as u64)
}

/// What is left of the back-off after `failures` failures, the last at `last`.
fn backoff_left(failures: i32, last: Option<Timestamp>, now: Timestamp) -> Duration {
    last.map(|t| backoff(failures).saturating_sub(secs(now.as_second() - t.as_second())))
        .unwrap_or(Duration::ZERO)
}

fn min_requeue(r: Option<Duration>, d: Duration) -> Option<Duration> {
    Some(r.map_or(d, |r| r.min(d)))
}

/// Whether the container restarts of a Job's running and pending pods reach `backoffLimit`
/// (any restart when it is 0): with `restartPolicy: OnFailure` a failing container restarts in
/// its pod instead of failing it, and upstream counts those restarts against the limit.
fn past_backoff_limit_on_failure(
    spec: &k8s_openapi::api::batch::v1::JobSpec,
    pods: &[Arc<Pod>],
) -> bool {
    let on_failure = spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        == Some("OnFailure");
    if !on_failure {
        return false;
    }
    let restarts: i32 = pods
        .iter()
        .filter(|p| matches!(phase(p), "Running" | "Pending"))
        .filter_map(|p| p.status.as_ref())
        .flat_map(|s| {
            let inits = s.init_container_statuses.iter().flatten();
            inits.chain(s.container_statuses.iter().flatten())
        })
        .map(|c| c.restart_count)
        .sum();
    match spec.backoff_limit.unwrap_or(6) {
        0 => restarts > 0,
        limit => restarts >= limit,
    }
}

/// A `podFailurePolicy` rule's action on a pod, and its `FailJob` message.
type Matched = (PolicyAction, Option<String>);

/// The failures of one index (with `backoffLimitPerIndex`).
#[derive(Default)]
struct IndexFailures {
    counted: i32,
    last: Option<Timestamp>,
    fail_index: bool,
}

/// The pure decision: given a Job, the pods it owns and the time, which pods to create and
/// delete, the counts for its status, and whether it ends now.
pub fn plan(job: &Job, pods: &[Arc<Pod>], now: Timestamp) -> Plan {
    let spec = job.spec.clone().unwrap_or_default();
    let parallelism = spec.parallelism.unwrap_or(1).max(0);
    // Without completions, the Job is done once any pod succeeds and none is running.
    let completions = spec.completions;
    let indexed = spec.completion_mode.as_deref() == Some("Indexed");
    let per_index_limit = spec.backoff_limit_per_index.filter(|_| indexed);
    let backoff_limit = spec.backoff_limit.unwrap_or(6).max(0);
    // Upstream replaces only failed pods (not terminating ones) when asked, and always under a
    // pod failure policy: a terminating pod's outcome is not known yet.
    let only_failed = spec.pod_replacement_policy.as_deref() == Some("Failed")
        || spec.pod_failure_policy.is_some();
    let in_range = |i: i32| completions.is_some_and(|c| i < c);
    let index_of = |p: &Pod| completion_index(p).filter(|i| in_range(*i));

    let active: Vec<&Arc<Pod>> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && !is_terminal(p))
        .collect();
    let terminating: Vec<&Arc<Pod>> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_some() && !is_terminal(p))
        .collect();
    // Failed pods, oldest failure first, with what the failure policy makes of each.
    let mut failed_pods: Vec<(&Arc<Pod>, Option<Matched>)> = pods
        .iter()
        .filter(|p| phase(p) == "Failed")
        .map(|p| {
            let matched = spec
                .pod_failure_policy
                .as_ref()
                .and_then(|policy| match_pod_failure_policy(policy, p));
            (p, matched)
        })
        .collect();
    failed_pods.sort_by_key(|(p, _)| (finished_at(p), p.metadata.name.clone()));
    let counted: Vec<&Arc<Pod>> = failed_pods
        .iter()
        .filter(|(_, m)| !matches!(m, Some((PolicyAction::Ignore, _))))
        .map(|(p, _)| *p)
        .collect();
    let fail_job = failed_pods.iter().find_map(|(_, m)| match m {
        Some((PolicyAction::FailJob, Some(msg))) => Some(msg.clone()),
        _ => None,
    });

    let old = job.status.clone().unwrap_or_default();
    // What the stored status already holds: only that may let a pod's finalizer go.
    let stored = |list: &Option<String>| match (list, completions) {
        (Some(s), Some(c)) if indexed => Intervals::parse(s, c),
        _ => Intervals::default(),
    };
    let stored_completed = stored(&old.completed_indexes);
    let stored_failed_indexes = stored(&old.failed_indexes);
    let succeeded_indexes = indexed.then(|| {
        Intervals::from_indexes(
            pods.iter()
                .filter(|p| phase(p) == "Succeeded")
                .filter_map(|p| index_of(p)),
        )
        .union(&stored_completed)
    });
    let mut per_index: BTreeMap<i32, IndexFailures> = BTreeMap::new();
    if per_index_limit.is_some() {
        for (p, m) in &failed_pods {
            let Some(i) = index_of(p) else { continue };
            let f = per_index.entry(i).or_default();
            match m {
                Some((PolicyAction::Ignore, _)) => {}
                Some((PolicyAction::FailIndex, _)) => {
                    f.fail_index = true;
                    f.counted += 1;
                }
                _ => f.counted += 1,
            }
            f.last = f.last.max(finished_at(p));
        }
        // Counted failed pods may be gone; each pod carries its index's earlier failures.
        for p in pods {
            let Some(i) = index_of(p) else { continue };
            let own = failed_pods.iter().any(|(f, m)| {
                f.metadata.uid == p.metadata.uid && !matches!(m, Some((PolicyAction::Ignore, _)))
            });
            let known = indexes::failure_count(p) + i32::from(own);
            let f = per_index.entry(i).or_default();
            f.counted = f.counted.max(known);
        }
    }
    let failed_indexes = per_index_limit.map(|limit| {
        Intervals::from_indexes(
            per_index
                .iter()
                .filter(|(i, f)| {
                    (f.fail_index || f.counted > limit)
                        && !succeeded_indexes.as_ref().is_some_and(|s| s.contains(**i))
                })
                .map(|(i, _)| *i),
        )
        .union(&stored_failed_indexes)
    });

    // Tracking with the pod finalizer: see [`tracking`].
    let ending = is_ending(job);
    let finished = is_finished(job);
    let (stored_succeeded, stored_failed) = tracking::uncounted(job);
    let ignored = |p: &Pod| {
        spec.pod_failure_policy
            .as_ref()
            .and_then(|policy| match_pod_failure_policy(policy, p))
            .is_some_and(|(a, _)| matches!(a, PolicyAction::Ignore))
    };
    // With `backoffLimitPerIndex` the newest failed pod of an unfinished index keeps its
    // finalizer until a replacement carries the index's failure count on (as upstream delays it).
    let mut newest: BTreeMap<i32, &Arc<Pod>> = BTreeMap::new();
    for p in pods {
        if let Some(i) = index_of(p) {
            let age = |p: &Pod| {
                (
                    p.metadata.creation_timestamp.as_ref().map(|t| t.0),
                    p.metadata.name.clone(),
                )
            };
            if newest.get(&i).is_none_or(|n| age(n) < age(p)) {
                newest.insert(i, p);
            }
        }
    }
    let held = |p: &Pod| {
        per_index_limit.is_some()
            && !ending
            && index_of(p).is_some_and(|i| {
                !stored_completed.contains(i)
                    && !stored_failed_indexes.contains(i)
                    && newest
                        .get(&i)
                        .is_some_and(|n| n.metadata.uid == p.metadata.uid)
            })
    };
    let (mut new_succeeded, mut new_failed) = (BTreeSet::new(), BTreeSet::new());
    let (mut release, mut release_after_write) = (Vec::new(), Vec::new());
    for p in pods.iter().filter(|p| tracking::has_finalizer(p)) {
        let key = ObjectKey::of(p.as_ref());
        let uid = p.metadata.uid.clone().unwrap_or_default();
        // An ended Job counts nothing more; an ending one counts every unfinished pod it
        // deletes as failed (upstream's rule, whatever the replacement policy).
        let failed = tracking::is_pod_failed(p, only_failed)
            || (ending && p.metadata.deletion_timestamp.is_some() && phase(p) != "Succeeded");
        if finished {
            release.push(key);
        } else if stored_succeeded.contains(&uid) || stored_failed.contains(&uid) {
            if !held(p) {
                release.push(key);
            }
        } else if phase(p) == "Succeeded" {
            match (indexed, index_of(p)) {
                (true, Some(i)) if !stored_completed.contains(i) => release_after_write.push(key),
                (true, _) => release.push(key),
                (false, _) => {
                    new_succeeded.insert(uid);
                    release_after_write.push(key);
                }
            }
        } else if failed {
            if ignored(p) || (indexed && index_of(p).is_none()) {
                release.push(key);
            } else {
                new_failed.insert(uid);
                if !held(p) {
                    release_after_write.push(key);
                }
            }
        }
    }
    // Recorded UIDs whose pods no longer carry the finalizer (or are gone) are counted now.
    let tracked: HashSet<&str> = pods
        .iter()
        .filter(|p| tracking::has_finalizer(p))
        .filter_map(|p| p.metadata.uid.as_deref())
        .collect();
    let split = |stored: &BTreeSet<String>| -> (i32, BTreeSet<String>) {
        let kept: BTreeSet<String> = stored
            .iter()
            .filter(|u| tracked.contains(u.as_str()))
            .cloned()
            .collect();
        ((stored.len() - kept.len()) as i32, kept)
    };
    let (moved, mut uncounted_succeeded) = split(&stored_succeeded);
    uncounted_succeeded.extend(new_succeeded);
    let succeeded_counter = match &succeeded_indexes {
        Some(s) => s.total(),
        None => old.succeeded.unwrap_or(0) + moved,
    };
    let (moved, mut uncounted_failed) = split(&stored_failed);
    uncounted_failed.extend(new_failed);
    let failed_counter = old.failed.unwrap_or(0) + moved;
    // The totals the Job's decisions use: counted and recorded alike.
    let succeeded = match &succeeded_indexes {
        Some(s) => s.total(),
        None => succeeded_counter + uncounted_succeeded.len() as i32,
    };
    let failed_total = failed_counter + uncounted_failed.len() as i32;
    let flushed = uncounted_succeeded.is_empty() && uncounted_failed.is_empty();

    let mut out = Plan {
        create: 0,
        indexes: Vec::new(),
        delete: Vec::new(),
        active: active.len() as i32,
        succeeded: succeeded_counter,
        failed: failed_counter,
        uncounted_succeeded,
        uncounted_failed,
        release,
        release_after_write,
        ready: active.iter().filter(|p| is_ready(p)).count() as i32,
        terminating: terminating.len() as i32,
        completed_indexes: succeeded_indexes.clone(),
        failed_indexes: failed_indexes.clone(),
        finish: None,
        terminal: false,
        requeue: None,
    };
    let keys = |list: &[&Arc<Pod>]| -> Vec<ObjectKey> {
        list.iter().map(|p| ObjectKey::of(p.as_ref())).collect()
    };
    if is_finished(job) {
        // An ended Job keeps no pods running.
        out.delete = keys(&active);
        return out;
    }
    // An interim condition already written decides how the Job ends.
    let from_condition = |condition: &'static str, c: &JobCondition| Finish {
        condition,
        reason: c.reason.clone().unwrap_or_default(),
        message: c.message.clone().unwrap_or_default(),
    };
    let started = job
        .status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .map(|t| t.0)
        .unwrap_or(now);
    let mut finish = if let Some(c) = condition(job, "SuccessCriteriaMet") {
        Some(from_condition("Complete", c))
    } else if let Some(c) = condition(job, "FailureTarget") {
        Some(from_condition("Failed", c))
    } else if let Some(msg) = fail_job {
        Some(Finish::failed("PodFailurePolicy", msg))
    } else if failed_total > backoff_limit || past_backoff_limit_on_failure(&spec, pods) {
        Some(Finish::failed(
            "BackoffLimitExceeded",
            "Job has reached the specified backoff limit",
        ))
    } else {
        None
    };
    // A suspended Job's deadline does not run (its start time is reset when it resumes).
    if finish.is_none() && spec.suspend != Some(true) {
        if let Some(deadline) = spec.active_deadline_seconds {
            let elapsed = secs(now.as_second() - started.as_second());
            if elapsed >= secs(deadline) {
                finish = Some(Finish::failed(
                    "DeadlineExceeded",
                    "Job was active longer than specified deadline",
                ));
            } else {
                out.requeue = Some(secs(deadline) - elapsed);
            }
        }
    }
    if let (None, Some(failed), Some(c)) = (&finish, &failed_indexes, completions) {
        if spec.max_failed_indexes.is_some_and(|m| failed.total() > m) {
            finish = Some(Finish::failed(
                "MaxFailedIndexesExceeded",
                "Job has exceeded the specified maximal number of failed indexes",
            ));
        } else if failed.total() > 0 && failed.total() + succeeded >= c {
            finish = Some(Finish::failed("FailedIndexes", "Job has failed indexes"));
        }
    }
    if let (None, Some(policy), Some(done), Some(c)) = (
        &finish,
        &spec.success_policy,
        &succeeded_indexes,
        completions,
    ) {
        if let Some(msg) = match_success_policy(policy, c, done) {
            finish = Some(Finish::complete("SuccessPolicy", msg));
        }
    }
    if finish.is_none() {
        let done = match completions {
            Some(c) => succeeded >= c,
            None => succeeded > 0 && active.is_empty(),
        };
        if done {
            finish = Some(Finish::complete(
                "CompletionsReached",
                "Reached expected number of succeeded pods",
            ));
        }
    }
    if let Some(f) = finish {
        // The remaining pods go; the terminal condition waits until none runs or terminates.
        out.delete = keys(&active);
        // … and for every finished pod to be counted.
        out.terminal = active.is_empty() && terminating.is_empty() && flushed;
        out.finish = Some(f);
        out.requeue = None;
        return out;
    }

    let failed_index_count = failed_indexes.as_ref().map_or(0, Intervals::total);
    let want = if spec.suspend == Some(true) {
        0
    } else {
        match completions {
            Some(c) => parallelism.min(c - succeeded - failed_index_count).max(0),
            // Work-queue Jobs stop starting pods once one has succeeded.
            None if succeeded > 0 => 0,
            None => parallelism,
        }
    };
    // Pods to delete whatever the count: for an Indexed Job, those without a valid index, of
    // an index already succeeded or failed, or a second pod of an index (the newest goes).
    let mut doomed: Vec<&Arc<Pod>> = Vec::new();
    let mut keep: Vec<&Arc<Pod>> = Vec::new();
    if indexed {
        let mut by_age = active.clone();
        by_age.sort_by_key(|p| {
            (
                p.metadata.creation_timestamp.as_ref().map(|t| t.0),
                p.metadata.name.clone(),
            )
        });
        let mut seen = HashSet::new();
        for p in by_age {
            let ok = index_of(p).is_some_and(|i| {
                !succeeded_indexes.as_ref().is_some_and(|s| s.contains(i))
                    && !failed_indexes.as_ref().is_some_and(|s| s.contains(i))
                    && seen.insert(i)
            });
            if ok {
                keep.push(p)
            } else {
                doomed.push(p)
            }
        }
    } else {
        keep = active.clone();
    }
    let have = keep.len() as i32
        + if only_failed {
            terminating.len() as i32
        } else {
            0
        };
    if have > want {
        // Surplus goes newest first: those have done the least work.
        keep.sort_by_key(|p| {
            std::cmp::Reverse(p.metadata.creation_timestamp.as_ref().map(|t| t.0))
        });
        let surplus = ((have - want) as usize).min(keep.len());
        doomed.extend(keep.into_iter().take(surplus));
    } else if have < want {
        let room = ((want - have) as usize).min(MAX_POD_CREATE_DELETE_PER_SYNC);
        if indexed {
            let busy: HashSet<i32> = keep
                .iter()
                .chain(terminating.iter().filter(|_| only_failed))
                .filter_map(|p| index_of(p))
                .collect();
            let global_wait = if per_index_limit.is_none() {
                backoff_left(
                    failed_total,
                    counted.iter().filter_map(|p| finished_at(p)).max(),
                    now,
                )
            } else {
                Duration::ZERO
            };
            if !global_wait.is_zero() {
                out.requeue = min_requeue(out.requeue, global_wait);
            } else {
                let c = completions.unwrap_or(0);
                let mut found = Vec::new();
                for i in 0..c {
                    if found.len() >= room {
                        break;
                    }
                    let taken = busy.contains(&i)
                        || succeeded_indexes.as_ref().is_some_and(|s| s.contains(i))
                        || failed_indexes.as_ref().is_some_and(|s| s.contains(i));
                    if taken {
                        continue;
                    }
                    let failures = per_index.get(&i);
                    if let Some(f) = failures {
                        let wait = backoff_left(f.counted, f.last, now);
                        if !wait.is_zero() {
                            out.requeue = min_requeue(out.requeue, wait);
                            continue;
                        }
                    }
                    found.push(NewIndex {
                        index: i,
                        failures: per_index_limit.map(|_| failures.map_or(0, |f| f.counted)),
                    });
                }
                out.create = found.len();
                out.indexes = found;
            }
        } else {
            // After failures, new pods wait out the back-off since the last failure.
            let last_failure = counted.iter().filter_map(|p| finished_at(p)).max();
            let wait = backoff_left(failed_total, last_failure, now);
            if wait.is_zero() {
                out.create = room;
            } else {
                out.requeue = min_requeue(out.requeue, wait);
            }
        }
    }
    doomed.truncate(MAX_POD_CREATE_DELETE_PER_SYNC);
    out.delete = keys(&doomed);
    out
}

/// Whether the Job that was synced (its `uid`) still wants pods, given its current state
/// (`None`: gone). Asked before each batch of creates: a Job deleted, or deleted and created
/// again under its name, while its pods are being created gets no more of them.
pub fn still_wants_pods(current: Option<&Job>, uid: &str) -> bool {
    current.is_some_and(|job| {
        job.metadata.uid.as_deref() == Some(uid)
            && job.metadata.deletion_timestamp.is_none()
            && !is_ending(job)
    })
}

/// Sets condition `type_` in `conditions`, moving its transition time only when its status
/// changes.
fn set_condition(
    conditions: &mut Vec<JobCondition>,
    now: Timestamp,
    (type_, status, reason, message): (&str, &str, &str, &str),
) {
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) if c.status == status => {}
        Some(c) => {
            c.status = status.into();
            c.reason = Some(reason.into());
            c.message = Some(message.into());
            c.last_transition_time = Some(Time(now));
            c.last_probe_time = Some(Time(now));
        }
        None => conditions.push(JobCondition {
            type_: type_.into(),
            status: status.into(),
            reason: Some(reason.into()),
            message: Some(message.into()),
            last_transition_time: Some(Time(now)),
            last_probe_time: Some(Time(now)),
        }),
    }
}

/// The Job's new status from a plan (conditions and times kept where unchanged).
pub fn status(job: &Job, plan: &Plan, now: Timestamp) -> JobStatus {
    let old = job.status.clone().unwrap_or_default();
    let mut conditions = old.conditions.clone().unwrap_or_default();
    let suspended = job.spec.as_ref().and_then(|s| s.suspend) == Some(true);
    let c = &mut conditions;
    if suspended && plan.finish.is_none() && !is_finished(job) {
        set_condition(
            c,
            now,
            ("Suspended", "True", "JobSuspended", "Job suspended"),
        );
    } else if c.iter().any(|x| x.type_ == "Suspended") {
        set_condition(c, now, ("Suspended", "False", "JobResumed", "Job resumed"));
    }
    if let Some(f) = &plan.finish {
        set_condition(c, now, (f.target(), "True", &f.reason, &f.message));
        if plan.terminal {
            set_condition(c, now, (f.condition, "True", &f.reason, &f.message));
        }
    }
    let completed_now = plan.terminal
        && plan
            .finish
            .as_ref()
            .is_some_and(|f| f.condition == "Complete");
    JobStatus {
        active: (plan.active > 0).then_some(plan.active),
        succeeded: (plan.succeeded > 0).then_some(plan.succeeded),
        failed: (plan.failed > 0).then_some(plan.failed),
        ready: Some(plan.ready),
        terminating: Some(plan.terminating),
        completed_indexes: plan
            .completed_indexes
            .as_ref()
            .filter(|s| !s.is_empty())
            .map(ToString::to_string),
        failed_indexes: plan.failed_indexes.as_ref().map(ToString::to_string),
        uncounted_terminated_pods: Some(tracking::to_status(
            &plan.uncounted_succeeded,
            &plan.uncounted_failed,
        )),
        start_time: old
            .start_time
            .clone()
            .or_else(|| (!suspended).then_some(Time(now))),
        completion_time: old
            .completion_time
            .clone()
            .or_else(|| completed_now.then_some(Time(now))),
        conditions: (!conditions.is_empty()).then_some(conditions),
    }
}

fn selector_of(job: &Job) -> LabelSelector {
    let v = serde_json::to_value(job.spec.as_ref().and_then(|s| s.selector.as_ref()))
        .unwrap_or(serde_json::Value::Null);
    LabelSelector::from_label_selector_json(&v).unwrap_or_else(|_| LabelSelector::nothing())
}

/// The reconciler of Jobs.
pub struct JobController {
    client: Client,
    jobs: Store<Job>,
    owned: OwnedPods,
    events: EventRecorder,
}

/// A new pod from the Job's template.
fn new_pod(job: &Job) -> Result<Pod, ReconcileError> {
    let template = job.spec.as_ref().map(|s| s.template.clone());
    let meta = template
        .as_ref()
        .and_then(|t| t.metadata.clone())
        .unwrap_or_default();
    let body = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": format!("{}-", job.name()),
            "namespace": job.namespace(),
            "labels": meta.labels,
            "annotations": meta.annotations,
            "finalizers": [tracking::FINALIZER],
            "ownerReferences": [{
                "apiVersion": "batch/v1", "kind": "Job", "name": job.name(),
                "uid": job.uid().unwrap_or_default(), "controller": true, "blockOwnerDeletion": true,
            }],
        },
        "spec": template.and_then(|t| t.spec),
    });
    serde_json::from_value(body).map_err(ReconcileError::terminal)
}

#[async_trait::async_trait]
impl Reconciler for JobController {
    async fn reconcile(&self, ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(job) = self.jobs.get(key) else {
            self.owned.expectations.forget(key);
            self.owned.fresh.forget(key);
            // The Job is gone: none of its pods may stay stuck on its finalizer.
            self.release_strays(key, None).await?;
            return Ok(Action::Done);
        };
        if job.metadata.deletion_timestamp.is_some() {
            // A Job being deleted counts nothing more (as upstream's).
            self.release_strays(key, None).await?;
            return Ok(Action::Done);
        }
        if !self.owned.expectations.satisfied(key) {
            return Ok(Action::RequeueAfter(Duration::from_secs(1)));
        }
        let uid = job.uid().unwrap_or_default();
        let selector = selector_of(&job);
        let ns = job.namespace().unwrap_or_default();
        let pods: Vec<Arc<Pod>> = self
            .owned
            .pods
            .by_owner(&uid)
            .into_iter()
            .filter(|p| {
                p.owner_references()
                    .iter()
                    .any(|r| r.controller == Some(true) && r.uid == uid)
            })
            .filter(|p| {
                let labels = p.metadata.labels.clone().unwrap_or_default();
                selector.matches(|k| labels.get(k).map(String::as_str))
            })
            .collect();
        // Pods of its name that are no longer its own (orphaned, another Job's, or no longer
        // selected) lose the finalizer.
        let mine: HashSet<&str> = pods
            .iter()
            .filter_map(|p| p.metadata.uid.as_deref())
            .collect();
        self.release_strays(key, Some(&mine)).await?;
        let now = crate::now();
        let mut p = plan(&job, &pods, now);
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        if p.create > 0 && self.owned.count_from_server(key, ctx.successor_term()) {
            // First create for this Job in a term taken over from another replica (the pods
            // its leader created last may not be in this replica's cache yet), or after a
            // create whose outcome is unknown (it may be on the server, not yet in the cache).
            let live = api
                .list(&ListParams::default().labels(&selector.to_string()))
                .await?;
            let live: Vec<Arc<Pod>> = live
                .items
                .into_iter()
                .filter(|pod| {
                    pod.owner_references()
                        .iter()
                        .any(|r| r.controller == Some(true) && r.uid == uid)
                })
                .map(Arc::new)
                .collect();
            let fresh = plan(&job, &live, now);
            self.owned.counted_from_server(key, ctx.successor_term());
            if fresh.create < p.create {
                ctx.observe(format!(
                    "the server has {} active pods, the cache {}: creating {} instead of {}",
                    fresh.active, p.active, fresh.create, p.create
                ));
                p.create = fresh.create;
                p.indexes = fresh.indexes;
            }
        }
        let reference = job.object_reference();
        let spec = job.spec.as_ref();
        let parallelism = spec.and_then(|s| s.parallelism).unwrap_or(1);
        if ctx.recording() {
            let completions = spec
                .and_then(|s| s.completions)
                .map_or("unset".to_string(), |c| c.to_string());
            ctx.observe(format!(
                "parallelism {parallelism}, completions {completions}; {} active, {} succeeded, {} failed, {} terminating",
                p.active, p.succeeded, p.failed, p.terminating
            ));
        }
        if p.create > 0 {
            ctx.action(
                format!("create {} pod(s)", p.create),
                "fewer active pods than the parallelism and the completions left allow",
            );
            let template = new_pod(&job)?;
            let pods: Vec<Pod> = if p.indexes.is_empty() {
                vec![template; p.create]
            } else {
                p.indexes
                    .iter()
                    .map(|new| {
                        let mut pod = template.clone();
                        indexes::for_index(&mut pod, &job.name(), new.index, new.failures);
                        pod
                    })
                    .collect()
            };
            self.owned
                .expectations
                .expect(key, p.create, Default::default());
            let jobs: Api<Job> = Api::namespaced(self.client.clone(), &ns);
            let proceed = || {
                let (jobs, cache, key, uid) =
                    (jobs.clone(), self.jobs.clone(), key.clone(), uid.clone());
                async move {
                    // Not once this reconcile's leadership term is over (the client would
                    // refuse the creates anyway).
                    // The cache costs nothing and usually knows already; the server is asked
                    // too, because the cache can lag a delete by the batches it takes.
                    ctx.may_act()
                        && still_wants_pods(cache.get(&key).as_deref(), &uid)
                        && match jobs.get_opt(&key.name).await {
                            Ok(current) => still_wants_pods(current.as_ref(), &uid),
                            Err(e) => {
                                tracing::debug!(job = %key, error = %e, "re-reading the Job failed; creating no more pods now");
                                false
                            }
                        }
                }
            };
            match crate::expectations::create_each_in_batches_while(
                &api,
                &pods,
                &self.owned.expectations,
                key,
                &self.events,
                &reference,
                proceed,
            )
            .await
            {
                BatchesEnd::Done => {}
                BatchesEnd::Stopped { created } => {
                    tracing::debug!(job = %key, created, wanted = p.create, "stopped creating pods: the Job no longer wants them");
                    // A Job that is gone is then forgotten; any other reason is looked at again.
                    return Ok(Action::RequeueAfter(Duration::from_secs(1)));
                }
                BatchesEnd::Failed(msg) => {
                    return Err(ReconcileError::retry(format!("creating pods: {msg}")));
                }
            }
        }
        for k in &p.delete {
            let Some(pod) = self.owned.pods.get(k) else {
                continue;
            };
            ctx.action(
                format!("delete pod {}", k.name),
                format!("more active pods than parallelism {parallelism} (or the Job is done)"),
            );
            let params = DeleteParams {
                precondition_uid: pod.uid(),
                ..DeleteParams::default()
            };
            match api.delete(&k.name, &params).await {
                Ok(_) => self.events.publish(
                    &reference,
                    EventType::Normal,
                    "SuccessfulDelete",
                    &format!("Deleted pod: {}", k.name),
                ),
                Err(e) if e.is_not_found() || e.is_conflict() => {}
                Err(e) => return Err(e.into()),
            }
        }
        let new_status = status(&job, &p, now);
        if job.status.as_ref() != Some(&new_status) {
            let jobs: Api<Job> = Api::namespaced(self.client.clone(), &ns);
            // An update, as upstream's controller writes it: its role
            // (`system:controller:job-controller`) grants update of jobs/status, not patch.
            let mut next = Job::clone(&job);
            next.status = Some(new_status);
            jobs.replace_status(&job.name(), &PostParams::default(), &next)
                .await?;
            // The event goes with the terminal condition, as upstream's.
            //
            // (Finalizers are removed below, after this write: the pods whose outcome it
            // records for the first time may go only once it is stored.)
            if let Some(f) = p.finish.as_ref().filter(|_| p.terminal) {
                if f.condition == "Complete" {
                    self.events.publish(
                        &reference,
                        EventType::Normal,
                        "Completed",
                        "Job completed",
                    );
                } else {
                    self.events
                        .publish(&reference, EventType::Warning, &f.reason, &f.message);
                }
            }
        }
        for k in p.release.iter().chain(&p.release_after_write) {
            if let Some(pod) = self.owned.pods.get(k) {
                release(&api, &pod).await?;
            }
        }
        Ok(match p.requeue {
            Some(d) => Action::RequeueAfter(d + Duration::from_millis(100)),
            None => Action::Done,
        })
    }

    /// A cancelled reconcile's writes may or may not have been sent: see
    /// [`Expectations::interrupted`](crate::expectations::Expectations::interrupted).
    fn interrupted(&self, key: &ObjectKey) {
        self.owned.expectations.interrupted(key);
    }
}

/// Removes the tracking finalizer from `pod` (gone already: nothing to do).
async fn release(api: &Api<Pod>, pod: &Pod) -> Result<(), ReconcileError> {
    match api
        .patch(
            &pod.name(),
            &PatchParams::default(),
            &tracking::remove_finalizer(pod),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        // The finalizers changed since the cache saw them (usually: already released by an
        // earlier pass the cache has not caught up with). That change's event brings another
        // pass, which looks again at the pod as it is.
        Err(e) if e.code() == Some(422) => {
            tracing::debug!(pod = %pod.name(), error = %e, "finalizers changed meanwhile; looking again on the next event");
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

impl JobController {
    /// Removes the tracking finalizer from the pods that name the Job `key` (by controller
    /// reference or the `job-name` labels) but are not among `mine` (`None`: the Job is gone
    /// or being deleted, so none is).
    async fn release_strays(
        &self,
        key: &ObjectKey,
        mine: Option<&HashSet<&str>>,
    ) -> Result<(), ReconcileError> {
        let ns = key.namespace.clone().unwrap_or_default();
        let names_job = |p: &Pod| {
            let labels = p.metadata.labels.as_ref();
            let label = |k: &str| labels.and_then(|l| l.get(k)) == Some(&key.name);
            label(JOB_NAME_LABEL)
                || label(LEGACY_JOB_NAME_LABEL)
                || p.owner_references()
                    .iter()
                    .any(|r| r.controller == Some(true) && r.kind == "Job" && r.name == key.name)
        };
        // A Job that exists finds its strays by label; for one gone, its pods may carry only
        // the owner reference, so its namespace is searched.
        let candidates = match mine {
            Some(_) => {
                let mut all = self.owned.pods.by_label(JOB_NAME_LABEL, &key.name);
                all.extend(self.owned.pods.by_label(LEGACY_JOB_NAME_LABEL, &key.name));
                all
            }
            None => self.owned.pods.by_namespace(&ns),
        };
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let mut seen = HashSet::new();
        for pod in candidates {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let ours = mine.is_some_and(|m| m.contains(uid.as_str()));
            if pod.namespace().as_deref() != Some(ns.as_str())
                || ours
                || !tracking::has_finalizer(&pod)
                || !names_job(&pod)
                || !seen.insert(uid)
            {
                continue;
            }
            release(&api, &pod).await?;
        }
        Ok(())
    }
}

/// The Job controller on `informers`.
pub fn controller(client: Client, informers: &SharedInformers) -> Controller {
    let reconciler = JobController {
        events: EventRecorder::new(client.clone(), Reporter::new("job-controller")),
        client,
        jobs: informers.typed::<Job>(Scope::all()).store(),
        owned: OwnedPods::watch(informers, OWNER),
    };
    Controller::for_type::<Job>(NAME, informers, None)
        .owns::<Job, Pod>(None)
        .build(Arc::new(reconciler))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::batch::v1::JobSpec;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStatus, PodStatus,
    };

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).unwrap()
    }

    fn job(completions: Option<i32>, parallelism: i32, backoff_limit: i32) -> Job {
        Job {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("j".into()),
                namespace: Some("ns".into()),
                uid: Some("uid".into()),
                ..Default::default()
            },
            spec: Some(JobSpec {
                completions,
                parallelism: Some(parallelism),
                backoff_limit: Some(backoff_limit),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn pod(name: &str, phase: &str, created: i64) -> Arc<Pod> {
        let finished = ContainerStatus {
            name: "c".into(),
            state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    finished_at: Some(Time(at(created + 1))),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        Arc::new(Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(name.into()),
                creation_timestamp: Some(Time(at(created))),
                finalizers: Some(vec![tracking::FINALIZER.into()]),
                ..Default::default()
            },
            spec: None,
            status: Some(PodStatus {
                phase: Some(phase.into()),
                container_statuses: matches!(phase, "Succeeded" | "Failed").then(|| vec![finished]),
                ..Default::default()
            }),
        })
    }

    #[test]
    fn starts_up_to_parallelism_and_no_more_than_needed() {
        let p = plan(&job(Some(3), 2, 6), &[], at(0));
        assert_eq!(p.create, 2);
        let running = [
            pod("a", "Running", 0),
            pod("b", "Succeeded", 0),
            pod("c", "Succeeded", 0),
        ];
        let p = plan(&job(Some(3), 2, 6), &running, at(10));
        assert_eq!(
            (p.create, p.active, succeeded(&p)),
            (0, 1, 2),
            "one left to go, one running"
        );
        let p = plan(&job(Some(3), 2, 6), &running[1..], at(10));
        assert_eq!(p.create, 1);
    }

    #[test]
    fn completes_when_enough_succeeded() {
        let pods = [
            pod("a", "Succeeded", 0),
            pod("b", "Succeeded", 0),
            pod("c", "Succeeded", 1),
        ];
        let j = job(Some(3), 2, 6);
        let (_, done, left) = settle(&j, &pods, at(10));
        assert!(is_finished(&done));
        let s = done.status.clone().unwrap();
        assert_eq!(s.succeeded, Some(3));
        assert!(s.completion_time.is_some());
        assert!(s
            .conditions
            .unwrap()
            .iter()
            .any(|c| c.type_ == "Complete" && c.status == "True"));
        assert!(left.iter().all(|p| !tracking::has_finalizer(p)));
    }

    #[test]
    fn finished_pods_are_recorded_then_released_then_counted() {
        let j = job(Some(3), 3, 6);
        let pods = [
            pod("a", "Succeeded", 0),
            pod("b", "Failed", 0),
            pod("c", "Running", 0),
        ];
        // Step 1: the UIDs go into uncountedTerminatedPods; no finalizer may go before that
        // status is stored.
        let p = plan(&j, &pods, at(30));
        assert_eq!((p.succeeded, p.failed), (0, 0));
        assert_eq!(p.uncounted_succeeded, BTreeSet::from(["a".to_string()]));
        assert_eq!(p.uncounted_failed, BTreeSet::from(["b".to_string()]));
        assert!(p.release.is_empty());
        assert_eq!(p.release_after_write.len(), 2);
        assert_eq!(p.create, 1, "the failed pod is replaced");
        let mut recorded = j.clone();
        recorded.status = Some(status(&j, &p, at(30)));
        let u = recorded
            .status
            .as_ref()
            .unwrap()
            .uncounted_terminated_pods
            .clone();
        assert_eq!(u.unwrap().succeeded, Some(vec!["a".to_string()]));
        // A restart before the finalizers went: nothing is recorded twice, and they may go.
        let p = plan(&recorded, &pods, at(31));
        assert_eq!(p.release.len(), 2);
        assert!(p.release_after_write.is_empty());
        assert_eq!(
            status(&recorded, &p, at(31)),
            recorded.status.clone().unwrap()
        );
        // Step 2 done for one pod only (a crash in between): step 3 counts just that one.
        let partly = [strip(&pods[0]), pods[1].clone(), pods[2].clone()];
        let p = plan(&recorded, &partly, at(32));
        assert_eq!((p.succeeded, p.failed), (1, 0));
        assert!(p.uncounted_succeeded.is_empty());
        assert_eq!(p.uncounted_failed.len(), 1);
        let (_, counted, left) = settle(&recorded, &partly, at(33));
        let s = counted.status.clone().unwrap();
        assert_eq!(
            (s.succeeded, s.failed, s.active),
            (Some(1), Some(1), Some(1))
        );
        assert_eq!(s.uncounted_terminated_pods, Some(Default::default()));
        // The finished pods deleted (pod GC, a user): the counts stay, nothing is recounted.
        let p = plan(&counted, &left[2..], at(40));
        assert_eq!(status(&counted, &p, at(40)), s);
        // A pod gone while still recorded (deleted after its finalizer went) is counted too.
        let p = plan(&recorded, &pods[2..], at(41));
        assert_eq!((p.succeeded, p.failed), (1, 1));
    }

    #[test]
    fn a_pod_deleted_while_running_counts_as_failed_unless_only_failed_pods_are_replaced() {
        let mut going = Pod::clone(&pod("a", "Running", 0));
        going.metadata.deletion_timestamp = Some(Time(at(1)));
        let pods = [Arc::new(going)];
        let j = job(Some(1), 1, 6);
        let p = plan(&j, &pods, at(2));
        assert_eq!(p.uncounted_failed.len(), 1);
        assert_eq!(
            p.release_after_write.len(),
            1,
            "so it never sticks terminating"
        );
        let (_, after, _) = settle(&j, &pods, at(2));
        assert_eq!(after.status.unwrap().failed, Some(1));
        let mut only_failed = j.clone();
        only_failed.spec.as_mut().unwrap().pod_replacement_policy = Some("Failed".into());
        let p = plan(&only_failed, &pods, at(2));
        assert!(p.uncounted_failed.is_empty() && p.release_after_write.is_empty());
        // It counts once the kubelet has marked it Failed.
        let mut failed = Pod::clone(&pods[0]);
        failed.status.as_mut().unwrap().phase = Some("Failed".into());
        let p = plan(&only_failed, &[Arc::new(failed)], at(3));
        assert_eq!(p.uncounted_failed.len(), 1);
    }

    #[test]
    fn pods_of_an_ended_job_are_released_uncounted() {
        let j = job(Some(1), 1, 6);
        let (_, done, _) = settle(&j, &[pod("a", "Succeeded", 0)], at(1));
        let late = pod("b", "Failed", 0);
        let p = plan(&done, &[late], at(2));
        assert_eq!(p.release.len(), 1);
        assert!(p.uncounted_failed.is_empty());
        assert_eq!(p.failed, 0);
    }

    #[test]
    fn failures_back_off_then_exceed_the_limit() {
        let j = job(Some(1), 1, 2);
        let one = [pod("a", "Failed", 0)];
        let p = plan(&j, &one, at(5));
        assert_eq!(p.create, 0, "waits out the 10 s back-off");
        assert_eq!(p.requeue, Some(Duration::from_secs(6)));
        assert_eq!(plan(&j, &one, at(11)).create, 1);
        let three = [
            pod("a", "Failed", 0),
            pod("b", "Failed", 20),
            pod("c", "Failed", 60),
        ];
        let p = plan(&j, &three, at(100));
        assert_eq!(p.finish.unwrap().reason, "BackoffLimitExceeded");
        assert_eq!(backoff(1), Duration::from_secs(10));
        assert_eq!(backoff(3), Duration::from_secs(40));
        assert_eq!(backoff(20), BACKOFF_MAX);
    }

    #[test]
    fn deadline_fails_the_job_and_stops_its_pods() {
        let mut j = job(Some(5), 2, 6);
        j.spec.as_mut().unwrap().active_deadline_seconds = Some(30);
        j.status = Some(JobStatus {
            start_time: Some(Time(at(0))),
            ..Default::default()
        });
        let pods = [pod("a", "Running", 0)];
        let p = plan(&j, &pods, at(10));
        assert_eq!(p.requeue, Some(Duration::from_secs(20)));
        let p = plan(&j, &pods, at(31));
        assert_eq!(p.finish.unwrap().reason, "DeadlineExceeded");
        assert_eq!(p.delete.len(), 1);
    }

    #[test]
    fn suspended_jobs_run_nothing_and_work_queue_jobs_stop_after_a_success() {
        let mut j = job(Some(3), 2, 6);
        j.spec.as_mut().unwrap().suspend = Some(true);
        let pods = [pod("a", "Running", 0)];
        let p = plan(&j, &pods, at(1));
        assert_eq!((p.create, p.delete.len()), (0, 1));
        let s = status(&j, &p, at(1));
        assert!(s.conditions.unwrap().iter().any(|c| c.type_ == "Suspended"));
        let wq = job(None, 2, 6);
        assert_eq!(plan(&wq, &[], at(0)).create, 2);
        let p = plan(
            &wq,
            &[pod("a", "Succeeded", 0), pod("b", "Running", 0)],
            at(5),
        );
        assert_eq!((p.create, p.finish), (0, None), "waits for the running pod");
        let p = plan(&wq, &[pod("a", "Succeeded", 0)], at(5));
        assert_eq!(p.finish.unwrap().condition, "Complete");
    }

    #[test]
    fn a_huge_job_gets_at_most_one_lot_of_pods_per_sync() {
        let huge = job(Some(i32::MAX), i32::MAX, 6);
        let p = plan(&huge, &[], at(0));
        assert_eq!(p.create, MAX_POD_CREATE_DELETE_PER_SYNC);
        let running: Vec<Arc<Pod>> = (0..700)
            .map(|i| pod(&format!("p{i}"), "Running", 0))
            .collect();
        assert_eq!(plan(&huge, &running, at(0)).create, 500);
        // Shrinking a huge Job deletes at most a lot per sync too.
        let shrunk = job(Some(i32::MAX), 1, 6);
        assert_eq!(plan(&shrunk, &running, at(0)).delete.len(), 500);
        // A lot goes out in slow-start batches; the largest is what can be in flight.
        let lot = crate::replicaset::batches(p.create);
        assert_eq!(lot, [1, 2, 4, 8, 16, 32, 64, 128, 245]);
    }

    #[test]
    fn a_deleted_or_replaced_job_wants_no_more_pods() {
        let j = job(Some(5), 5, 6);
        assert!(still_wants_pods(Some(&j), "uid"));
        assert!(!still_wants_pods(None, "uid"), "gone");
        assert!(
            !still_wants_pods(Some(&j), "other"),
            "recreated under its name"
        );
        let mut deleting = j.clone();
        deleting.metadata.deletion_timestamp = Some(Time(at(1)));
        assert!(!still_wants_pods(Some(&deleting), "uid"));
        let mut failed = j.clone();
        failed.status = Some(JobStatus {
            conditions: Some(vec![JobCondition {
                type_: "Failed".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        assert!(!still_wants_pods(Some(&failed), "uid"), "ended");
    }

    #[test]
    fn finished_jobs_change_nothing_but_stop_leftovers() {
        let j = job(Some(1), 1, 6);
        let (_, done, pods) = settle(&j, &[pod("a", "Succeeded", 0)], at(1));
        let again = plan(&done, &pods, at(2));
        assert_eq!(again.finish, None);
        assert_eq!(status(&done, &again, at(2)), done.status.clone().unwrap());
    }

    /// Succeeded pods counted and recorded.
    fn succeeded(p: &Plan) -> i32 {
        p.succeeded + p.uncounted_succeeded.len() as i32
    }

    /// The pod without its finalizers.
    fn strip(p: &Arc<Pod>) -> Arc<Pod> {
        let mut p = Pod::clone(p);
        p.metadata.finalizers = None;
        Arc::new(p)
    }

    /// Runs the controller's passes over `job` and `pods` until nothing changes, as its I/O
    /// would: each plan's status is stored, then the finalizers it lets go are removed.
    /// Returns the last plan, the Job and the pods.
    fn settle(job: &Job, pods: &[Arc<Pod>], now: Timestamp) -> (Plan, Job, Vec<Arc<Pod>>) {
        let (mut job, mut pods) = (job.clone(), pods.to_vec());
        for _ in 0..10 {
            let p = plan(&job, &pods, now);
            let next = status(&job, &p, now);
            let gone: Vec<&ObjectKey> = p.release.iter().chain(&p.release_after_write).collect();
            let changed = job.status.as_ref() != Some(&next) || !gone.is_empty();
            job.status = Some(next);
            pods = pods
                .iter()
                .map(|pod| {
                    if gone.contains(&&ObjectKey::of(pod.as_ref())) {
                        strip(pod)
                    } else {
                        pod.clone()
                    }
                })
                .collect();
            if !changed {
                return (p, job, pods);
            }
        }
        panic!("the passes do not settle");
    }

    fn indexed(completions: i32, parallelism: i32) -> Job {
        let mut j = job(Some(completions), parallelism, 6);
        j.spec.as_mut().unwrap().completion_mode = Some("Indexed".into());
        j
    }

    /// A pod of index `i` in `phase`; a failed one exited with `code`.
    fn ipod(name: &str, i: i32, phase: &str, code: i32, created: i64) -> Arc<Pod> {
        let mut p = Pod::clone(&pod(name, phase, created));
        p.metadata.annotations = Some(
            [(indexes::COMPLETION_INDEX.to_string(), i.to_string())]
                .into_iter()
                .collect(),
        );
        if let Some(cs) = p.status.as_mut().unwrap().container_statuses.as_mut() {
            cs[0].name = "main".into();
            cs[0]
                .state
                .as_mut()
                .unwrap()
                .terminated
                .as_mut()
                .unwrap()
                .exit_code = code;
        }
        Arc::new(p)
    }

    fn created(p: &Plan) -> Vec<i32> {
        p.indexes.iter().map(|n| n.index).collect()
    }

    #[test]
    fn indexed_jobs_create_the_lowest_missing_indexes_and_report_them() {
        let j = indexed(5, 2);
        assert_eq!(created(&plan(&j, &[], at(0))), [0, 1]);
        let pods = [
            ipod("a", 0, "Succeeded", 0, 0),
            ipod("b", 1, "Running", 0, 0),
            ipod("c", 3, "Succeeded", 0, 0),
            ipod("d", 4, "Succeeded", 0, 0),
        ];
        let p = plan(&j, &pods, at(5));
        assert_eq!(created(&p), [2]);
        assert_eq!(p.succeeded, 3);
        let s = status(&j, &p, at(5));
        assert_eq!(s.completed_indexes.as_deref(), Some("0,3,4"));
        assert_eq!(s.failed_indexes, None, "only with backoffLimitPerIndex");
        // A second pod of an index, one of a succeeded index, and one without an index go.
        let mut dup = Pod::clone(&ipod("e", 1, "Running", 0, 1));
        dup.metadata.name = Some("e".into());
        let stray = pod("f", "Running", 0);
        let late = ipod("g", 0, "Running", 0, 2);
        let p = plan(
            &j,
            &[pods[0].clone(), pods[1].clone(), Arc::new(dup), stray, late],
            at(5),
        );
        let mut gone: Vec<String> = p.delete.iter().map(|k| k.name.clone()).collect();
        gone.sort();
        assert_eq!(gone, ["e", "f", "g"]);
        // All indexes succeeded: complete, with upstream's reason and message.
        let all: Vec<Arc<Pod>> = (0..5)
            .map(|i| ipod(&format!("p{i}"), i, "Succeeded", 0, 0))
            .collect();
        let p = plan(&j, &all, at(9));
        let f = p.finish.clone().unwrap();
        assert_eq!(
            (f.reason.as_str(), f.message.as_str()),
            (
                "CompletionsReached",
                "Reached expected number of succeeded pods"
            )
        );
        let s = status(&j, &p, at(9));
        assert_eq!(s.completed_indexes.as_deref(), Some("0-4"));
        let types: Vec<&str> = s
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.type_.as_str())
            .collect();
        assert_eq!(types, ["SuccessCriteriaMet", "Complete"]);
    }

    fn fail_job_on_42() -> k8s_openapi::api::batch::v1::PodFailurePolicy {
        use k8s_openapi::api::batch::v1::{
            PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement, PodFailurePolicyRule,
        };
        let rule = |action: &str, values: Vec<i32>| PodFailurePolicyRule {
            action: action.into(),
            on_exit_codes: Some(PodFailurePolicyOnExitCodesRequirement {
                container_name: None,
                operator: "In".into(),
                values,
            }),
            on_pod_conditions: None,
        };
        PodFailurePolicy {
            rules: vec![
                rule("FailJob", vec![42]),
                rule("Ignore", vec![7]),
                rule("FailIndex", vec![9]),
            ],
        }
    }

    #[test]
    fn fail_job_rule_fails_the_job_at_once_in_two_steps() {
        let mut j = job(Some(3), 2, 6);
        j.spec.as_mut().unwrap().pod_failure_policy = Some(fail_job_on_42());
        let pods = [ipod("a", 0, "Failed", 42, 0), ipod("b", 1, "Running", 0, 0)];
        let p = plan(&j, &pods, at(2));
        let f = p.finish.clone().unwrap();
        assert_eq!(f.reason, "PodFailurePolicy");
        assert_eq!(
            f.message,
            "Container main for pod ns/a failed with exit code 42 matching FailJob rule at index 0"
        );
        assert_eq!((p.delete.len(), p.terminal, p.create), (1, false, 0));
        let mut ending = j.clone();
        ending.status = Some(status(&j, &p, at(2)));
        let conds = ending.status.as_ref().unwrap().conditions.clone().unwrap();
        assert_eq!(conds.len(), 1);
        assert_eq!(conds[0].type_, "FailureTarget");
        assert!(
            !still_wants_pods(Some(&ending), "uid"),
            "an ending Job starts nothing"
        );
        // The running pod is being deleted: still not Failed.
        let mut going = Pod::clone(&pods[1]);
        going.metadata.deletion_timestamp = Some(Time(at(3)));
        let p = plan(&ending, &[pods[0].clone(), Arc::new(going)], at(3));
        assert_eq!((p.terminating, p.terminal), (1, false));
        // Gone: Failed, with the FailureTarget's reason and message.
        let (_, gone, _) = settle(&ending, &pods[..1], at(4));
        assert!(is_finished(&gone));
        let s = gone.status.unwrap();
        assert_eq!(s.failed, Some(1));
        let failed = s
            .conditions
            .unwrap()
            .into_iter()
            .find(|c| c.type_ == "Failed")
            .unwrap();
        assert_eq!(failed.reason.as_deref(), Some("PodFailurePolicy"));
        assert_eq!(failed.message, Some(f.message));
        assert_eq!(s.completion_time, None, "only a complete Job has one");
    }

    #[test]
    fn ignored_failures_neither_count_nor_back_off() {
        let mut j = job(Some(1), 1, 0);
        j.spec.as_mut().unwrap().pod_failure_policy = Some(fail_job_on_42());
        let p = plan(&j, &[ipod("a", 0, "Failed", 7, 0)], at(1));
        assert_eq!((p.failed, p.create, p.finish.is_none()), (0, 1, true));
        let p = plan(&j, &[ipod("a", 0, "Failed", 3, 0)], at(1));
        assert_eq!(p.finish.unwrap().reason, "BackoffLimitExceeded", "counted");
    }

    #[test]
    fn backoff_limit_per_index_fails_indexes_not_the_job() {
        let mut j = indexed(3, 3);
        j.spec.as_mut().unwrap().backoff_limit_per_index = Some(1);
        j.spec.as_mut().unwrap().backoff_limit = Some(i32::MAX);
        j.spec.as_mut().unwrap().pod_failure_policy = Some(fail_job_on_42());
        let pods = [
            ipod("a", 1, "Failed", 1, 0),
            ipod("b", 0, "Running", 0, 0),
            ipod("c", 2, "Running", 0, 0),
        ];
        // One failure of index 1: retried after its own back-off, with its count annotated.
        let p = plan(&j, &pods, at(5));
        assert_eq!((p.create, p.requeue), (0, Some(Duration::from_secs(6))));
        let p = plan(&j, &pods, at(20));
        assert_eq!(
            p.indexes,
            [NewIndex {
                index: 1,
                failures: Some(1)
            }]
        );
        assert_eq!(status(&j, &p, at(20)).failed_indexes.as_deref(), Some(""));
        // A second failure exceeds the per-index limit; so does a FailIndex rule at once.
        let twice = [
            pods[0].clone(),
            ipod("d", 1, "Failed", 1, 30),
            pods[1].clone(),
            pods[2].clone(),
        ];
        let p = plan(&j, &twice, at(100));
        assert_eq!(p.failed_indexes.as_ref().unwrap().to_string(), "1");
        assert_eq!((p.create, p.finish.clone()), (0, None));
        let fail_index = [
            ipod("a", 1, "Failed", 9, 0),
            pods[1].clone(),
            pods[2].clone(),
        ];
        assert_eq!(
            plan(&j, &fail_index, at(100))
                .failed_indexes
                .unwrap()
                .to_string(),
            "1"
        );
        // The others done: the Job fails for its failed index.
        let rest = [
            twice[0].clone(),
            twice[1].clone(),
            ipod("e", 0, "Succeeded", 0, 0),
            ipod("f", 2, "Succeeded", 0, 0),
        ];
        let f = plan(&j, &rest, at(100)).finish.unwrap();
        assert_eq!(
            (f.reason.as_str(), f.message.as_str()),
            ("FailedIndexes", "Job has failed indexes")
        );
        j.spec.as_mut().unwrap().max_failed_indexes = Some(0);
        let f = plan(&j, &twice, at(100)).finish.unwrap();
        assert_eq!(f.reason, "MaxFailedIndexesExceeded");
        assert_eq!(
            f.message,
            "Job has exceeded the specified maximal number of failed indexes"
        );
    }

    #[test]
    fn indexed_successes_are_recorded_by_index_and_an_index_keeps_its_last_failure() {
        let j = indexed(2, 2);
        let pods = [
            ipod("a", 0, "Succeeded", 0, 0),
            ipod("b", 1, "Running", 0, 0),
        ];
        let p = plan(&j, &pods, at(1));
        assert!(p.uncounted_succeeded.is_empty(), "the index is enough");
        assert_eq!((p.release.len(), p.release_after_write.len()), (0, 1));
        let mut stored = j.clone();
        stored.status = Some(status(&j, &p, at(1)));
        let s = stored.status.as_ref().unwrap();
        assert_eq!(
            (s.completed_indexes.as_deref(), s.succeeded),
            (Some("0"), Some(1))
        );
        assert_eq!(plan(&stored, &pods, at(2)).release.len(), 1);
        // The index survives its pod.
        assert_eq!(plan(&stored, &pods[1..], at(2)).succeeded, 1);

        let mut j = indexed(2, 2);
        j.spec.as_mut().unwrap().backoff_limit_per_index = Some(2);
        let pods = [ipod("a", 0, "Failed", 1, 0), ipod("b", 1, "Running", 0, 0)];
        let (_, after, left) = settle(&j, &pods, at(1));
        assert!(
            tracking::has_finalizer(&left[0]),
            "kept until its index has a new pod"
        );
        let u = after
            .status
            .clone()
            .unwrap()
            .uncounted_terminated_pods
            .unwrap();
        assert_eq!(u.failed, Some(vec!["a".to_string()]));
        let mut next = Pod::clone(&ipod("c", 0, "Running", 0, 20));
        next.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(indexes::INDEX_FAILURE_COUNT.into(), "1".into());
        let next = Arc::new(next);
        let (_, after, left) = settle(
            &after,
            &[left[0].clone(), left[1].clone(), next.clone()],
            at(30),
        );
        assert!(!tracking::has_finalizer(&left[0]));
        assert_eq!(after.status.clone().unwrap().failed, Some(1));
        // With the failed pod gone, its failure still counts for the index: a second one
        // fails it past a limit of 1.
        let mut strict = after.clone();
        strict.spec.as_mut().unwrap().backoff_limit_per_index = Some(1);
        let mut second = Pod::clone(&next);
        second.status = ipod("c", 0, "Failed", 1, 20).status.clone();
        let p = plan(&strict, &[Arc::new(second), left[1].clone()], at(60));
        assert_eq!(p.failed_indexes.unwrap().to_string(), "0");
    }

    #[test]
    fn success_policy_completes_early_and_stops_the_rest() {
        use k8s_openapi::api::batch::v1::{SuccessPolicy, SuccessPolicyRule};
        let mut j = indexed(4, 4);
        j.spec.as_mut().unwrap().success_policy = Some(SuccessPolicy {
            rules: vec![SuccessPolicyRule {
                succeeded_indexes: Some("0".into()),
                succeeded_count: None,
            }],
        });
        let pods = [
            ipod("a", 0, "Succeeded", 0, 0),
            ipod("b", 1, "Running", 0, 0),
        ];
        let p = plan(&j, &pods, at(1));
        let f = p.finish.clone().unwrap();
        assert_eq!(
            (f.reason.as_str(), f.message.as_str()),
            ("SuccessPolicy", "Matched rules at index 0")
        );
        assert_eq!((p.delete.len(), p.terminal), (1, false));
        let mut ending = j.clone();
        ending.status = Some(status(&j, &p, at(1)));
        let p = plan(&ending, &pods[..1], at(2));
        let s = status(&ending, &p, at(2));
        let complete = s
            .conditions
            .unwrap()
            .into_iter()
            .find(|c| c.type_ == "Complete")
            .unwrap();
        assert_eq!(complete.reason.as_deref(), Some("SuccessPolicy"));
        assert!(s.completion_time.is_some());
    }

    #[test]
    fn replacement_waits_for_terminating_pods_only_when_asked() {
        let mut terminating = Pod::clone(&pod("a", "Running", 0));
        terminating.metadata.deletion_timestamp = Some(Time(at(1)));
        let pods = [Arc::new(terminating)];
        let mut j = job(Some(1), 1, 6);
        j.spec.as_mut().unwrap().pod_replacement_policy = Some("TerminatingOrFailed".into());
        let p = plan(&j, &pods, at(2));
        assert_eq!((p.create, p.terminating, p.active), (1, 1, 0));
        assert_eq!(status(&j, &p, at(2)).terminating, Some(1));
        j.spec.as_mut().unwrap().pod_replacement_policy = Some("Failed".into());
        assert_eq!(plan(&j, &pods, at(2)).create, 0);
    }

    #[test]
    fn on_failure_restarts_count_against_the_backoff_limit() {
        use k8s_openapi::api::core::v1::{PodSpec, PodTemplateSpec};
        let mut j = job(Some(1), 1, 3);
        j.spec.as_mut().unwrap().template = PodTemplateSpec {
            metadata: None,
            spec: Some(PodSpec {
                restart_policy: Some("OnFailure".into()),
                ..Default::default()
            }),
        };
        let restarted = |n: i32| {
            let mut p = Pod::clone(&pod("a", "Running", 0));
            p.status.as_mut().unwrap().container_statuses = Some(vec![ContainerStatus {
                name: "c".into(),
                restart_count: n,
                ..Default::default()
            }]);
            Arc::new(p)
        };
        assert_eq!(plan(&j, &[restarted(2)], at(1)).finish, None);
        let f = plan(&j, &[restarted(3)], at(1)).finish.unwrap();
        assert_eq!(f.reason, "BackoffLimitExceeded");
        j.spec.as_mut().unwrap().backoff_limit = Some(0);
        assert!(plan(&j, &[restarted(1)], at(1)).finish.is_some());
    }
}
