//! The Job controller: runs a Job's pods until `completions` of them succeed, at most
//! `parallelism` at a time, giving up after `backoffLimit` failed pods or past
//! `activeDeadlineSeconds`.
//!
//! Finished pods are kept (as upstream does until the Job is deleted), so the counts in the
//! status are always recomputed from the pods the cache shows — never accumulated in memory —
//! and a restarted controller reaches the same decision. A failed pod is replaced after a
//! back-off of 10 s doubling per failure (capped at 6 min), as Kubernetes does.
//!
//! Pods are created as upstream creates them: at most [`MAX_POD_CREATE_DELETE_PER_SYNC`] per
//! sync, in slow-start batches (1, 2, 4 …) behind expectations, stopping at the first failed
//! create — and, before every batch, unless the Job still wants them ([`still_wants_pods`]),
//! so deleting a Job that asked for millions of pods stops its pods within one batch.
//!
//! [`plan`] is the pure decision; [`JobController`] does the I/O around it.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::{Job, JobCondition, JobStatus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;
use setpoint_api::selector::LabelSelector;
use setpoint_runtime::client::{Api, Client, DeleteParams, PostParams};
use setpoint_runtime::controller::{Action, Context, Controller, ReconcileError, Reconciler};
use setpoint_runtime::events::{EventRecorder, EventType, Reporter, ToObjectReference};
use setpoint_runtime::informer::{Scope, SharedInformers, Store};
use setpoint_runtime::{Object, ObjectKey};

use crate::expectations::{BatchesEnd, OwnedPods, Owner};

/// The controller's name (work queue, metrics, logs, event reporter).
pub const NAME: &str = "job";
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

/// How a Job ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finish {
    /// `Complete` or `Failed`.
    pub condition: &'static str,
    /// The condition's `reason`: `Completed`, `BackoffLimitExceeded` or `DeadlineExceeded`.
    pub reason: &'static str,
    /// The condition's human-readable `message`.
    pub message: String,
}

/// What one pass over a Job should do.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Pods to create.
    pub create: usize,
    /// Active pods to delete (surplus, or all of them once the Job has ended).
    pub delete: Vec<ObjectKey>,
    /// The counts the pods imply.
    pub active: i32,
    /// Pods that reached phase `Succeeded` (`status.succeeded`).
    pub succeeded: i32,
    /// Pods that reached phase `Failed` (`status.failed`).
    pub failed: i32,
    /// Active pods whose `Ready` condition is `True` (`status.ready`).
    pub ready: i32,
    /// The Job ends now (it had not before).
    pub finish: Option<Finish>,
    /// Look again after this long (a back-off or deadline running out).
    pub requeue: Option<Duration>,
}

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
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
fn has_condition(job: &Job, t: &str) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == t && c.status == "True"))
}

/// Whether the Job has ended (`Complete` or `Failed`).
pub fn is_finished(job: &Job) -> bool {
    has_condition(job, "Complete") || has_condition(job, "Failed")
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

/// The pure decision: given a Job, the pods it owns and the time, which pods to create and
/// delete, the counts for its status, and whether it ends now.
pub fn plan(job: &Job, pods: &[Arc<Pod>], now: Timestamp) -> Plan {
    let spec = job.spec.clone().unwrap_or_default();
    let parallelism = spec.parallelism.unwrap_or(1).max(0);
    // Without completions, the Job is done once any pod succeeds and none is running.
    let completions = spec.completions;
    let backoff_limit = spec.backoff_limit.unwrap_or(6).max(0);
    let live: Vec<&Arc<Pod>> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    let active: Vec<&Arc<Pod>> = live
        .iter()
        .copied()
        .filter(|p| !matches!(phase(p), "Succeeded" | "Failed"))
        .collect();
    let succeeded = pods.iter().filter(|p| phase(p) == "Succeeded").count() as i32;
    let failed = pods.iter().filter(|p| phase(p) == "Failed").count() as i32;
    let ready = active.iter().filter(|p| is_ready(p)).count() as i32;
    let mut out = Plan {
        create: 0,
        delete: Vec::new(),
        active: active.len() as i32,
        succeeded,
        failed,
        ready,
        finish: None,
        requeue: None,
    };
    let all_active = |out: &mut Plan| {
        out.delete = active.iter().map(|p| ObjectKey::of(p.as_ref())).collect();
    };
    if is_finished(job) {
        // An ended Job keeps no pods running.
        all_active(&mut out);
        return out;
    }
    let started = job
        .status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .map(|t| t.0)
        .unwrap_or(now);
    if let Some(deadline) = spec.active_deadline_seconds {
        let elapsed = secs(now.as_second() - started.as_second());
        if elapsed >= secs(deadline) {
            out.finish = Some(Finish {
                condition: "Failed",
                reason: "DeadlineExceeded",
                message: "Job was active longer than specified deadline".into(),
            });
            all_active(&mut out);
            return out;
        }
        out.requeue = Some(secs(deadline) - elapsed);
    }
    if failed > backoff_limit {
        out.finish = Some(Finish {
            condition: "Failed",
            reason: "BackoffLimitExceeded",
            message: "Job has reached the specified backoff limit".into(),
        });
        all_active(&mut out);
        return out;
    }
    let done = match completions {
        Some(c) => succeeded >= c,
        None => succeeded > 0 && active.is_empty(),
    };
    if done {
        out.finish = Some(Finish {
            condition: "Complete",
            reason: "Completed",
            message: "Job completed".into(),
        });
        all_active(&mut out);
        return out;
    }
    let want = if spec.suspend == Some(true) {
        0
    } else {
        match completions {
            Some(c) => parallelism.min(c - succeeded).max(0),
            // Work-queue Jobs stop starting pods once one has succeeded.
            None if succeeded > 0 => 0,
            None => parallelism,
        }
    };
    let have = active.len() as i32;
    if have > want {
        // Surplus goes newest first: those have done the least work.
        let mut by_age: Vec<&&Arc<Pod>> = active.iter().collect();
        by_age.sort_by_key(|p| {
            std::cmp::Reverse(p.metadata.creation_timestamp.as_ref().map(|t| t.0))
        });
        out.delete = by_age
            .into_iter()
            .take(((have - want) as usize).min(MAX_POD_CREATE_DELETE_PER_SYNC))
            .map(|p| ObjectKey::of(p.as_ref()))
            .collect();
    } else if have < want {
        // After failures, new pods wait out the back-off since the last failure.
        let last_failure = pods
            .iter()
            .filter(|p| phase(p) == "Failed")
            .filter_map(|p| finished_at(p))
            .max();
        let wait = last_failure
            .map(|t| backoff(failed).saturating_sub(secs(now.as_second() - t.as_second())))
            .unwrap_or(Duration::ZERO);
        if wait.is_zero() {
            out.create = ((want - have) as usize).min(MAX_POD_CREATE_DELETE_PER_SYNC);
        } else {
            out.requeue = Some(out.requeue.map_or(wait, |r| r.min(wait)));
        }
    }
    out
}

/// Whether the Job that was synced (its `uid`) still wants pods, given its current state
/// (`None`: gone). Asked before each batch of creates: a Job deleted, or deleted and created
/// again under its name, while its pods are being created gets no more of them.
pub fn still_wants_pods(current: Option<&Job>, uid: &str) -> bool {
    current.is_some_and(|job| {
        job.metadata.uid.as_deref() == Some(uid)
            && job.metadata.deletion_timestamp.is_none()
            && !is_finished(job)
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
        let target = if f.condition == "Failed" {
            "FailureTarget"
        } else {
            "SuccessCriteriaMet"
        };
        set_condition(c, now, (target, "True", f.reason, &f.message));
        set_condition(c, now, (f.condition, "True", f.reason, &f.message));
    }
    let finished_now = plan
        .finish
        .as_ref()
        .is_some_and(|f| f.condition == "Complete");
    JobStatus {
        active: (plan.active > 0).then_some(plan.active),
        succeeded: (plan.succeeded > 0).then_some(plan.succeeded),
        failed: (plan.failed > 0).then_some(plan.failed),
        ready: Some(plan.ready),
        start_time: old
            .start_time
            .clone()
            .or_else(|| (!suspended).then_some(Time(now))),
        completion_time: old
            .completion_time
            .clone()
            .or_else(|| finished_now.then_some(Time(now))),
        conditions: (!conditions.is_empty()).then_some(conditions),
        ..old
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
    async fn reconcile(&self, _ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(job) = self.jobs.get(key) else {
            self.owned.expectations.forget(key);
            return Ok(Action::Done);
        };
        if job.metadata.deletion_timestamp.is_some() {
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
        let now = crate::now();
        let p = plan(&job, &pods, now);
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let reference = job.object_reference();
        if p.create > 0 {
            let template = new_pod(&job)?;
            self.owned
                .expectations
                .expect(key, p.create, Default::default());
            let jobs: Api<Job> = Api::namespaced(self.client.clone(), &ns);
            let proceed = || {
                let (jobs, cache, key, uid) =
                    (jobs.clone(), self.jobs.clone(), key.clone(), uid.clone());
                async move {
                    // The cache costs nothing and usually knows already; the server is asked
                    // too, because the cache can lag a delete by the batches it takes.
                    still_wants_pods(cache.get(&key).as_deref(), &uid)
                        && match jobs.get_opt(&key.name).await {
                            Ok(current) => still_wants_pods(current.as_ref(), &uid),
                            Err(e) => {
                                tracing::debug!(job = %key, error = %e, "re-reading the Job failed; creating no more pods now");
                                false
                            }
                        }
                }
            };
            match crate::expectations::create_in_batches_while(
                &api,
                &template,
                p.create,
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
            if let Some(f) = &p.finish {
                let (kind, reason) = if f.condition == "Complete" {
                    (EventType::Normal, "Completed")
                } else {
                    (EventType::Warning, f.reason)
                };
                self.events.publish(&reference, kind, reason, &f.message);
            }
        }
        Ok(match p.requeue {
            Some(d) => Action::RequeueAfter(d + Duration::from_millis(100)),
            None => Action::Done,
        })
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
                creation_timestamp: Some(Time(at(created))),
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
            (p.create, p.active, p.succeeded),
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
        let p = plan(&j, &pods, at(10));
        assert_eq!(p.finish.as_ref().unwrap().condition, "Complete");
        let s = status(&j, &p, at(10));
        assert_eq!(s.succeeded, Some(3));
        assert!(s.completion_time.is_some());
        assert!(s
            .conditions
            .unwrap()
            .iter()
            .any(|c| c.type_ == "Complete" && c.status == "True"));
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
        let p = plan(&j, &[pod("a", "Succeeded", 0)], at(1));
        let mut done = j.clone();
        done.status = Some(status(&j, &p, at(1)));
        let again = plan(&done, &[pod("a", "Succeeded", 0)], at(2));
        assert_eq!(again.finish, None);
        assert_eq!(status(&done, &again, at(2)), done.status.clone().unwrap());
    }
}
