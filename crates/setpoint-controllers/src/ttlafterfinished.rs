//! The TTL-after-finished controller (upstream's `ttl-after-finished-controller`): a finished
//! Job with `spec.ttlSecondsAfterFinished` is deleted, with `propagationPolicy: Foreground`
//! so its pods go first, once its finish time plus the TTL has passed. The finish time is
//! the `lastTransitionTime` of its `Complete` or `Failed` condition. Before that the Job is
//! looked at again when the TTL runs out.
//!
//! [`decide`] is the pure decision; the reconciler reads the Job from the server once more
//! before deleting it, as upstream does, so a TTL changed meanwhile is honoured, and deletes
//! with the fresh `resourceVersion` as a precondition.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::jiff::Timestamp;
use setpoint_runtime::client::{Api, Client, DeleteParams};
use setpoint_runtime::controller::{Action, Context, Controller, ReconcileError, Reconciler};
use setpoint_runtime::informer::{Scope, SharedInformers, Store};
use setpoint_runtime::{Object, ObjectKey};

/// The controller's name, upstream's (`--controllers`, work queue, metrics, logs).
pub const NAME: &str = "ttl-after-finished";

/// What to do with a Job now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// No TTL, not finished, or already being deleted: nothing, ever (until it changes).
    Nothing,
    /// Finished, but its TTL runs out only after this long: look again then.
    Wait(Duration),
    /// Its TTL has run out: delete it.
    Delete,
    /// Finished without a time on its condition, so the TTL cannot be counted.
    NoFinishTime,
}

/// When a finished Job finished: the `lastTransitionTime` of its true `Complete` or `Failed`
/// condition. `None` while it runs; `Some(None)` when the condition carries no time.
pub fn finish_time(job: &Job) -> Option<Option<Timestamp>> {
    if !crate::job::is_finished(job) {
        return None;
    }
    let conditions = job.status.as_ref()?.conditions.as_ref()?;
    Some(
        conditions
            .iter()
            .find(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
            .and_then(|c| c.last_transition_time.as_ref().map(|t| t.0)),
    )
}

/// The decision for `job` at `now`.
pub fn decide(job: &Job, now: Timestamp) -> Decision {
    let ttl = job.spec.as_ref().and_then(|s| s.ttl_seconds_after_finished);
    let Some(ttl) = ttl else {
        return Decision::Nothing;
    };
    if job.metadata.deletion_timestamp.is_some() {
        return Decision::Nothing;
    }
    let Some(finished) = finish_time(job) else {
        return Decision::Nothing;
    };
    let Some(finished) = finished else {
        return Decision::NoFinishTime;
    };
    // Validation keeps the TTL non-negative; a negative one is read as none left to wait.
    let expires = finished.as_second().saturating_add(i64::from(ttl.max(0)));
    let left = expires - now.as_second();
    if left <= 0 {
        Decision::Delete
    } else {
        Decision::Wait(Duration::from_secs(left as u64))
    }
}

/// What [`decide`] looked at, for the decision record: the TTL, the finish time and when it
/// expires.
fn observed(job: &Job, now: Timestamp) -> String {
    let ttl = job.spec.as_ref().and_then(|s| s.ttl_seconds_after_finished);
    let Some(ttl) = ttl else {
        return "no ttlSecondsAfterFinished".to_string();
    };
    if job.metadata.deletion_timestamp.is_some() {
        return format!("ttlSecondsAfterFinished {ttl}; the Job is being deleted");
    }
    match finish_time(job) {
        None => format!("ttlSecondsAfterFinished {ttl}; the Job has not finished"),
        Some(None) => format!(
            "ttlSecondsAfterFinished {ttl}; finished, but its condition has no lastTransitionTime"
        ),
        Some(Some(finished)) => {
            let expires =
                Timestamp::from_second(finished.as_second().saturating_add(i64::from(ttl.max(0))))
                    .map_or_else(|_| "never".to_string(), |t| t.to_string());
            format!(
                "finished at {finished}, ttlSecondsAfterFinished {ttl}: expires at {expires} (now {})",
                Timestamp::from_second(now.as_second()).unwrap_or(now)
            )
        }
    }
}

struct TtlAfterFinishedController {
    client: Client,
    jobs: Store<Job>,
}

#[async_trait::async_trait]
impl Reconciler for TtlAfterFinishedController {
    async fn reconcile(&self, ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(job) = self.jobs.get(key) else {
            ctx.observe("the Job is gone");
            return Ok(Action::Done);
        };
        let now = crate::now();
        if ctx.recording() {
            ctx.observe(observed(&job, now));
        }
        match decide(&job, now) {
            Decision::Nothing => return Ok(Action::Done),
            // Whole seconds are stored, so wake a little after the second has passed.
            Decision::Wait(d) => return Ok(Action::RequeueAfter(d + Duration::from_millis(100))),
            Decision::NoFinishTime => {
                return Err(ReconcileError::terminal(format!(
                    "unable to find the time when the Job {}/{} finished",
                    key.namespace.as_deref().unwrap_or_default(),
                    key.name
                )))
            }
            Decision::Delete => {}
        }
        // The cache may be behind: the TTL may have been changed or removed. Decide again
        // over a fresh read, and delete exactly that version.
        let api: Api<Job> = Api::namespaced(
            self.client.clone(),
            key.namespace.as_deref().unwrap_or_default(),
        );
        let Some(fresh) = api.get_opt(&key.name).await? else {
            ctx.observe("a fresh read: the Job is gone");
            return Ok(Action::Done);
        };
        let decision = decide(&fresh, now);
        if decision != Decision::Delete && ctx.recording() {
            ctx.observe(format!("a fresh read: {}", observed(&fresh, now)));
        }
        match decision {
            Decision::Delete => {}
            Decision::Wait(d) => return Ok(Action::RequeueAfter(d + Duration::from_millis(100))),
            _ => return Ok(Action::Done),
        }
        ctx.action(
            format!("delete job {} (Foreground)", key.name),
            "its finish time plus ttlSecondsAfterFinished has passed (so says a fresh read too)",
        );
        tracing::info!(job = %key, "cleaning up Job");
        let params = DeleteParams {
            precondition_resource_version: fresh.resource_version(),
            ..DeleteParams::foreground()
        };
        match api.delete(&key.name, &params).await {
            Ok(_) => Ok(Action::Done),
            Err(e) if e.is_not_found() => Ok(Action::Done),
            // Changed since the read: the change brings it back with its new state.
            Err(e) if e.is_conflict() => Ok(Action::Done),
            Err(e) => Err(e.into()),
        }
    }
}

/// The TTL-after-finished controller, reconciling every Job when it changes.
pub fn controller(client: Client, informers: &SharedInformers) -> Controller {
    let reconciler = TtlAfterFinishedController {
        client,
        jobs: informers.typed::<Job>(Scope::all()).store(),
    };
    Controller::for_type::<Job>(NAME, informers, None).build(Arc::new(reconciler))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job(ttl: Option<i32>, condition: Option<(&str, &str, Option<&str>)>) -> Job {
        let conditions =
            condition.map(|(t, s, at)| json!([{"type": t, "status": s, "lastTransitionTime": at}]));
        serde_json::from_value(json!({
            "metadata": {"name": "j", "namespace": "default"},
            "spec": {"ttlSecondsAfterFinished": ttl, "template": {}},
            "status": {"conditions": conditions}
        }))
        .unwrap()
    }

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn a_finished_job_waits_out_its_ttl_then_goes() {
        let j = job(
            Some(60),
            Some(("Complete", "True", Some("2026-01-01T00:00:00Z"))),
        );
        assert_eq!(
            decide(&j, at("2026-01-01T00:00:20Z")),
            Decision::Wait(Duration::from_secs(40))
        );
        assert_eq!(decide(&j, at("2026-01-01T00:01:00Z")), Decision::Delete);
        assert_eq!(decide(&j, at("2026-01-01T01:00:00Z")), Decision::Delete);
    }

    #[test]
    fn a_zero_ttl_deletes_at_once_and_failed_jobs_count_too() {
        let j = job(
            Some(0),
            Some(("Failed", "True", Some("2026-01-01T00:00:00Z"))),
        );
        assert_eq!(decide(&j, at("2026-01-01T00:00:00Z")), Decision::Delete);
    }

    #[test]
    fn unfinished_untimed_or_deleting_jobs_are_left_alone() {
        let running = job(Some(0), None);
        assert_eq!(
            decide(&running, at("2026-01-01T00:00:00Z")),
            Decision::Nothing
        );
        let suspended = job(
            Some(0),
            Some(("Complete", "False", Some("2026-01-01T00:00:00Z"))),
        );
        assert_eq!(
            decide(&suspended, at("2026-01-01T00:00:00Z")),
            Decision::Nothing
        );
        let no_ttl = job(
            None,
            Some(("Complete", "True", Some("2026-01-01T00:00:00Z"))),
        );
        assert_eq!(
            decide(&no_ttl, at("2030-01-01T00:00:00Z")),
            Decision::Nothing
        );
        let mut deleting = job(
            Some(0),
            Some(("Complete", "True", Some("2026-01-01T00:00:00Z"))),
        );
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at("2026-01-01T00:00:01Z")),
        );
        assert_eq!(
            decide(&deleting, at("2026-01-01T00:00:05Z")),
            Decision::Nothing
        );
        let untimed = job(Some(0), Some(("Complete", "True", None)));
        assert_eq!(
            decide(&untimed, at("2026-01-01T00:00:00Z")),
            Decision::NoFinishTime
        );
    }

    /// The decision record of a deletion: what the TTL was counted from, and the delete.
    #[tokio::test]
    async fn the_decision_record_says_when_the_ttl_ran_out() {
        use setpoint_runtime::client::{Patch, PatchParams, PostParams};
        use setpoint_runtime::decision;
        let cluster = setpoint_testing::TestCluster::start().await;
        let client = cluster.client();
        let informers = SharedInformers::new(client.clone());
        let task = tokio::spawn(controller(client.clone(), &informers).run(std::future::pending()));
        let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
        let j: Job = serde_json::from_value(json!({
            "metadata": {"name": "ttl-record"},
            "spec": {"ttlSecondsAfterFinished": 5, "template": {"spec": {
                "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}
        }))
        .unwrap();
        jobs.create(&PostParams::default(), &j).await.unwrap();
        let finished = json!({"status": {
            "startTime": "2020-01-01T00:00:00Z",
            "completionTime": "2020-01-01T00:00:01Z",
            "conditions": [{"type": "Complete", "status": "True",
                            "lastTransitionTime": "2020-01-01T00:00:01Z"}]
        }});
        jobs.patch_status(
            "ttl-record",
            &PatchParams::default(),
            &Patch::Merge(finished),
        )
        .await
        .unwrap();
        let record = setpoint_testing::eventually("the decision deleting the Job", || async {
            decision::ring()
                .about(NAME, "ttl-record")
                .into_iter()
                .find(|r| r.object.namespace == "default" && !r.actions.is_empty())
        })
        .await;
        assert_eq!(
            record.actions[0].action,
            "delete job ttl-record (Foreground)"
        );
        assert!(!record.actions[0].rule.is_empty());
        assert!(
            record.observed[0].starts_with(
                "finished at 2020-01-01T00:00:01Z, ttlSecondsAfterFinished 5: expires at 2020-01-01T00:00:06Z (now "
            ),
            "{record:?}"
        );
        task.abort();
        cluster.stop().await;
    }

    #[test]
    fn a_finish_time_in_the_future_waits_for_it() {
        // Clock skew between the job controller and this one: wait rather than delete early.
        let j = job(
            Some(10),
            Some(("Complete", "True", Some("2026-01-01T00:01:00Z"))),
        );
        assert_eq!(
            decide(&j, at("2026-01-01T00:00:00Z")),
            Decision::Wait(Duration::from_secs(70))
        );
    }
}
