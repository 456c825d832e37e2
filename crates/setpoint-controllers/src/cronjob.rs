//! The CronJob controller: creates a Job for each time its schedule comes round, honouring
//! `concurrencyPolicy`, `suspend` and `startingDeadlineSeconds`, and keeps the finished Jobs
//! down to the history limits.
//!
//! A Job's name is the CronJob's name and the scheduled minute (`<name>-<unix minutes>`), as
//! upstream names them, so creating it twice is impossible: a restarted controller, or two
//! passes racing, find it already exists. The schedule is evaluated from
//! `status.lastScheduleTime` (or the creation time), so missed runs are noticed after
//! downtime and only the latest one runs. The schedule's fields are read in `spec.timeZone`
//! (an IANA zone, see [`setpoint_api::cron`]), else UTC. A `TZ=`/`CRON_TZ=` prefix in the
//! schedule wins, with upstream's `UnsupportedSchedule` warning.
//!
//! [`plan`] is the pure decision; [`CronJobController`] does the I/O around it. The clock is
//! injectable so tests can move time instead of waiting for minutes.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use serde_json::{json, Value};
use setpoint_runtime::client::{Api, Client, DeleteParams, PostParams};
use setpoint_runtime::controller::{Action, Context, Controller, ReconcileError, Reconciler};
use setpoint_runtime::events::{EventRecorder, EventType, Reporter, ToObjectReference};
use setpoint_runtime::informer::{Scope, SharedInformers, Store};
use setpoint_runtime::{Object, ObjectKey};

use setpoint_api::cron::Schedule;

/// The controller's name (work queue, metrics, logs).
pub const NAME: &str = "cronjob";
/// Most missed start times looked at after downtime (upstream's limit).
pub const MAX_MISSED: usize = 100;

/// Where the controller reads the time.
pub type Clock = Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>;

/// What one pass over a CronJob should do.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Create the Job for this scheduled time (its name, and the time).
    pub create: Option<(String, DateTime<Utc>)>,
    /// Active Jobs to delete first (`Replace`).
    pub replace: Vec<String>,
    /// Finished Jobs beyond the history limits.
    pub prune: Vec<String>,
    /// A start time was skipped: (event reason, message).
    pub skipped: Option<(&'static str, String)>,
    /// Jobs still running.
    pub active: Vec<String>,
    /// The newest completion time of a successful Job.
    pub last_successful: Option<DateTime<Utc>>,
    /// When the schedule next comes round.
    pub next: Option<DateTime<Utc>>,
    /// Start times that came round since the last scheduled one (or the creation), the one
    /// to run included; more than [`MAX_MISSED`] are not all counted.
    pub missed: usize,
}

fn ts(t: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>) -> Option<DateTime<Utc>> {
    t.as_ref()
        .and_then(|t| DateTime::from_timestamp(t.0.as_second(), 0))
}

fn job_finished(job: &Job) -> Option<&'static str> {
    let cs = job.status.as_ref()?.conditions.as_ref()?;
    if cs
        .iter()
        .any(|c| c.type_ == "Complete" && c.status == "True")
    {
        Some("Complete")
    } else if cs.iter().any(|c| c.type_ == "Failed" && c.status == "True") {
        Some("Failed")
    } else {
        None
    }
}

/// The last start time at or before `now`, looked for in growing windows back from it.
fn latest_at_or_before(schedule: &Schedule, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    for window in [
        chrono::Duration::hours(1),
        chrono::Duration::days(1),
        chrono::Duration::days(32),
        chrono::Duration::days(366 * 5),
    ] {
        let mut t = now - window;
        let mut last = None;
        while let Some(n) = schedule.next_after(t) {
            if n > now {
                break;
            }
            last = Some(n);
            t = n;
        }
        if last.is_some() {
            return last;
        }
    }
    None
}

/// The name of the Job for the run scheduled at `t`.
pub fn job_name(cronjob: &str, t: DateTime<Utc>) -> String {
    format!("{cronjob}-{}", t.timestamp() / 60)
}

/// Why a CronJob cannot be planned; each is reported as a Warning event of its reason.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The schedule does not parse (`UnparseableSchedule`).
    #[error("{0}")]
    UnparseableSchedule(String),
    /// `spec.timeZone` names no zone of the IANA database (`UnknownTimeZone`).
    #[error("{0}")]
    UnknownTimeZone(String),
}

impl PlanError {
    /// The event reason, as upstream's controller gives it.
    pub fn reason(&self) -> &'static str {
        match self {
            PlanError::UnparseableSchedule(_) => "UnparseableSchedule",
            PlanError::UnknownTimeZone(_) => "UnknownTimeZone",
        }
    }
}

/// Upstream's `UnsupportedSchedule` warning for a schedule that names its own zone (`TZ=` or
/// `CRON_TZ=`): it is honoured as written, but only `spec.timeZone` is supported.
pub fn unsupported_schedule(cj: &CronJob) -> Option<String> {
    let schedule = &cj.spec.as_ref()?.schedule;
    schedule.contains("TZ").then(|| {
        format!(
            "CRON_TZ or TZ used in schedule {schedule:?} is not officially supported, see https://kubernetes.io/docs/concepts/workloads/controllers/cron-jobs/ for more details"
        )
    })
}

/// The pure decision: given a CronJob, the Jobs it owns and the time.
pub fn plan(cj: &CronJob, jobs: &[Arc<Job>], now: DateTime<Utc>) -> Result<Plan, PlanError> {
    let spec = cj.spec.clone().unwrap_or_default();
    let schedule = Schedule::parse(&spec.schedule).map_err(|e| {
        PlanError::UnparseableSchedule(format!("unparseable schedule: {:?} : {e}", spec.schedule))
    })?;
    // Times are computed in `spec.timeZone` (a TZ= prefix in the schedule wins, as upstream's
    // controller keeps the schedule as written then). An unknown zone starts nothing.
    let schedule = match spec.time_zone.as_deref() {
        Some(zone) => match setpoint_api::cron::time_zone(zone) {
            Ok(tz) => schedule.in_zone(tz),
            Err(e) => {
                return Err(PlanError::UnknownTimeZone(format!(
                    "invalid timeZone: {zone:?}: {e}"
                )))
            }
        },
        None => schedule,
    };
    let name = cj.name();
    let mut active: Vec<&Arc<Job>> = Vec::new();
    let mut succeeded: Vec<(&Arc<Job>, DateTime<Utc>)> = Vec::new();
    let mut failed: Vec<(&Arc<Job>, DateTime<Utc>)> = Vec::new();
    for j in jobs {
        let when = ts(&j.metadata.creation_timestamp).unwrap_or(now);
        match job_finished(j) {
            None if j.metadata.deletion_timestamp.is_none() => active.push(j),
            None => {}
            Some("Complete") => succeeded.push((
                j,
                j.status
                    .as_ref()
                    .and_then(|s| ts(&s.completion_time))
                    .unwrap_or(when),
            )),
            Some(_) => failed.push((j, when)),
        }
    }
    let mut out = Plan {
        create: None,
        replace: Vec::new(),
        prune: Vec::new(),
        skipped: None,
        active: active.iter().map(|j| j.name()).collect(),
        last_successful: succeeded.iter().map(|(_, t)| *t).max(),
        next: schedule.next_after(now),
        missed: 0,
    };
    // History: the newest N of each outcome stay.
    for (mut list, limit) in [
        (succeeded, spec.successful_jobs_history_limit.unwrap_or(3)),
        (failed, spec.failed_jobs_history_limit.unwrap_or(1)),
    ] {
        list.sort_by_key(|(_, t)| std::cmp::Reverse(*t));
        out.prune.extend(
            list.iter()
                .skip(limit.max(0) as usize)
                .map(|(j, _)| j.name()),
        );
    }
    if spec.suspend == Some(true) {
        return Ok(out);
    }
    let since = cj
        .status
        .as_ref()
        .and_then(|s| ts(&s.last_schedule_time))
        .or_else(|| ts(&cj.metadata.creation_timestamp))
        .unwrap_or(now);
    // The most recent start time in (since, now], counting how many were missed.
    let mut latest = None;
    let mut missed = 0;
    let mut t = since;
    while let Some(n) = schedule.next_after(t) {
        if n > now {
            break;
        }
        latest = Some(n);
        missed += 1;
        t = n;
        if missed > MAX_MISSED {
            // Don't walk every start of a long gap: find the last one directly.
            latest = latest_at_or_before(&schedule, now).or(latest);
            break;
        }
    }
    out.missed = missed;
    let Some(scheduled) = latest else {
        return Ok(out);
    };
    if missed > MAX_MISSED {
        out.skipped = Some((
            "TooManyMissedTimes",
            format!("too many missed start times: > {MAX_MISSED}; only the latest runs"),
        ));
    }
    if let Some(deadline) = spec.starting_deadline_seconds {
        if (now - scheduled).num_seconds() > deadline {
            out.skipped = Some((
                "MissSchedule",
                format!(
                    "Missed scheduled time to start a job: {}",
                    scheduled.to_rfc3339()
                ),
            ));
            return Ok(out);
        }
    }
    let job = job_name(&name, scheduled);
    if jobs.iter().any(|j| j.name() == job) {
        return Ok(out);
    }
    match spec.concurrency_policy.as_deref().unwrap_or("Allow") {
        "Forbid" if !active.is_empty() => {
            out.skipped = Some((
                "JobAlreadyActive",
                "Not starting job because prior execution is running and concurrency policy is Forbid".into(),
            ));
            return Ok(out);
        }
        "Replace" => out.replace = out.active.clone(),
        _ => {}
    }
    out.create = Some((job, scheduled));
    Ok(out)
}

/// The Job for a scheduled run, from the CronJob's template.
fn new_job(cj: &CronJob, name: &str, scheduled: DateTime<Utc>) -> Result<Job, ReconcileError> {
    let template = cj
        .spec
        .as_ref()
        .map(|s| s.job_template.clone())
        .unwrap_or_default();
    let meta = template.metadata.unwrap_or_default();
    let mut annotations = meta.annotations.unwrap_or_default();
    annotations.insert(
        "batch.kubernetes.io/cronjob-scheduled-timestamp".into(),
        scheduled.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    );
    let body = json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": cj.namespace(),
            "labels": meta.labels,
            "annotations": annotations,
            "ownerReferences": [{
                "apiVersion": "batch/v1", "kind": "CronJob", "name": cj.name(),
                "uid": cj.uid().unwrap_or_default(), "controller": true, "blockOwnerDeletion": true,
            }],
        },
        "spec": template.spec,
    });
    serde_json::from_value(body).map_err(ReconcileError::terminal)
}

/// The reconciler of CronJobs.
pub struct CronJobController {
    client: Client,
    cronjobs: Store<CronJob>,
    jobs: Store<Job>,
    events: EventRecorder,
    clock: Clock,
}

fn reference(job: &Job) -> Value {
    json!({"apiVersion": "batch/v1", "kind": "Job", "name": job.name(),
           "namespace": job.namespace(), "uid": job.uid(),
           "resourceVersion": job.resource_version()})
}

#[async_trait::async_trait]
impl Reconciler for CronJobController {
    async fn reconcile(&self, ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(cj) = self.cronjobs.get(key) else {
            ctx.observe("the CronJob is gone");
            return Ok(Action::Done);
        };
        if cj.metadata.deletion_timestamp.is_some() {
            ctx.observe("the CronJob is being deleted: left to the garbage collector");
            return Ok(Action::Done);
        }
        let ns = cj.namespace().unwrap_or_default();
        let uid = cj.uid().unwrap_or_default();
        let jobs: Vec<Arc<Job>> = self
            .jobs
            .by_owner(&uid)
            .into_iter()
            .filter(|j| {
                j.owner_references()
                    .iter()
                    .any(|r| r.controller == Some(true) && r.uid == uid)
            })
            .collect();
        let now = (self.clock)();
        let cref = cj.object_reference();
        if let Some(message) = unsupported_schedule(&cj) {
            self.events
                .publish(&cref, EventType::Warning, "UnsupportedSchedule", &message);
        }
        let p = match plan(&cj, &jobs, now) {
            Ok(p) => p,
            Err(e) => {
                let message = e.to_string();
                ctx.observe(format!("{}: {message}", e.reason()));
                self.events
                    .publish(&cref, EventType::Warning, e.reason(), &message);
                return Err(ReconcileError::terminal(message));
            }
        };
        if ctx.recording() {
            observe_plan(ctx, &cj, &p, now);
        }
        let job_api: Api<Job> = Api::namespaced(self.client.clone(), &ns);
        let background = DeleteParams::background();
        for name in p.replace.iter().chain(&p.prune) {
            if ctx.recording() {
                ctx.action(
                    format!("delete job {name}"),
                    delete_rule(&cj, &p, &jobs, name),
                );
            }
            match job_api.delete(name, &background).await {
                Ok(_) => self.events.publish(
                    &cref,
                    EventType::Normal,
                    "SuccessfulDelete",
                    &format!("Deleted job {name}"),
                ),
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        if let Some((reason, message)) = &p.skipped {
            self.events
                .publish(&cref, EventType::Warning, reason, message);
        }
        let mut active: Vec<Value> = jobs
            .iter()
            .filter(|j| p.active.contains(&j.name()) && !p.replace.contains(&j.name()))
            .map(|j| reference(j))
            .collect();
        let mut last_schedule = cj
            .status
            .as_ref()
            .and_then(|s| s.last_schedule_time.clone());
        if let Some((name, scheduled)) = &p.create {
            let job = new_job(&cj, name, *scheduled)?;
            if ctx.recording() {
                ctx.action(
                    format!("create job {name}"),
                    create_rule(&cj, &p, *scheduled),
                );
            }
            match job_api.create(&PostParams::default(), &job).await {
                Ok(created) => {
                    self.events.publish(
                        &cref,
                        EventType::Normal,
                        "SuccessfulCreate",
                        &format!("Created job {name}"),
                    );
                    active.push(reference(&created));
                }
                // Created by an earlier pass whose write the cache has not shown yet.
                Err(e) if e.is_already_exists() => {}
                Err(e) => {
                    self.events.publish(
                        &cref,
                        EventType::Warning,
                        "FailedCreate",
                        &format!("Error creating job: {e}"),
                    );
                    return Err(e.into());
                }
            }
            last_schedule = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::from_second(scheduled.timestamp())
                    .map_err(ReconcileError::terminal)?,
            ));
        }
        let status = json!({
            "active": if active.is_empty() { Value::Null } else { Value::Array(active) },
            "lastScheduleTime": last_schedule,
            "lastSuccessfulTime": p.last_successful.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
        });
        let current = serde_json::to_value(&cj.status).unwrap_or(Value::Null);
        let same = |k: &str| current.get(k).unwrap_or(&Value::Null) == &status[k];
        if !(same("active") && same("lastScheduleTime") && same("lastSuccessfulTime")) {
            let api: Api<CronJob> = Api::namespaced(self.client.clone(), &ns);
            // An update, as upstream's controller writes it: its role
            // (`system:controller:cronjob-controller`) grants update of cronjobs/status, not
            // patch.
            let mut next = CronJob::clone(&cj);
            next.status = Some(serde_json::from_value(status).map_err(ReconcileError::terminal)?);
            ctx.action(
                "update status",
                "the active Jobs, lastScheduleTime or lastSuccessfulTime changed",
            );
            api.replace_status(&cj.name(), &PostParams::default(), &next)
                .await?;
        }
        Ok(match p.next {
            // A second of slack so the pass lands after the scheduled minute has begun.
            Some(next) => Action::RequeueAfter(
                (next - now).to_std().unwrap_or(Duration::ZERO) + Duration::from_secs(1),
            ),
            None => Action::Done,
        })
    }
}

/// A time as the record gives it (RFC 3339, whole seconds, UTC).
fn when(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Adds what a pass over `cj` observed to its decision record: the schedule, the last
/// scheduled time, the active Jobs, the start times missed, and a start skipped.
fn observe_plan(ctx: &Context, cj: &CronJob, p: &Plan, now: DateTime<Utc>) {
    let spec = cj.spec.clone().unwrap_or_default();
    let last = cj
        .status
        .as_ref()
        .and_then(|s| ts(&s.last_schedule_time))
        .map_or_else(|| "none".to_string(), when);
    // A `TZ=` prefix in the schedule wins over `spec.timeZone`.
    let zone = if unsupported_schedule(cj).is_some() {
        "the zone it names"
    } else {
        spec.time_zone.as_deref().unwrap_or("UTC")
    };
    const LISTED: usize = 3;
    let active = match p.active.len() {
        0 => String::new(),
        n if n <= LISTED => format!(" ({})", p.active.join(", ")),
        n => format!(
            " ({}, and {} more)",
            p.active[..LISTED].join(", "),
            n - LISTED
        ),
    };
    ctx.observe(format!(
        "schedule {:?} in {}{}; now {}, lastScheduleTime {last}, next {}; {} active job(s){}",
        spec.schedule,
        zone,
        if spec.suspend == Some(true) {
            " (suspended)"
        } else {
            ""
        },
        when(now),
        p.next.map_or_else(|| "none".to_string(), when),
        p.active.len(),
        active,
    ));
    if p.missed > 1 {
        ctx.observe(format!(
            "{}{} start times came round since the last: only the latest runs",
            if p.missed > MAX_MISSED {
                "more than "
            } else {
                ""
            },
            p.missed.min(MAX_MISSED),
        ));
    }
    if let Some((reason, message)) = &p.skipped {
        ctx.observe(format!("{reason}: {message}"));
    }
}

/// Why the Job for `scheduled` is created (for the decision record).
fn create_rule(cj: &CronJob, p: &Plan, scheduled: DateTime<Utc>) -> String {
    let policy = cj
        .spec
        .as_ref()
        .and_then(|s| s.concurrency_policy.as_deref())
        .unwrap_or("Allow");
    let why = match policy {
        "Forbid" => "Forbid: no Job is active".to_string(),
        "Replace" if !p.replace.is_empty() => {
            format!("Replace: the active Job(s) {} go", p.replace.join(", "))
        }
        other => other.to_string(),
    };
    format!(
        "scheduled time {} is due and has no Job; concurrencyPolicy {why}",
        when(scheduled)
    )
}

/// Why the Job `name` is deleted (for the decision record).
fn delete_rule(cj: &CronJob, p: &Plan, jobs: &[Arc<Job>], name: &str) -> String {
    if p.replace.iter().any(|r| r == name) {
        return "concurrencyPolicy Replace: a new scheduled time is due while it is active"
            .to_string();
    }
    let spec = cj.spec.clone().unwrap_or_default();
    match jobs
        .iter()
        .find(|j| j.name() == name)
        .and_then(|j| job_finished(j))
    {
        Some("Complete") => format!(
            "successfulJobsHistoryLimit {}: older than the newest successful Jobs kept",
            spec.successful_jobs_history_limit.unwrap_or(3)
        ),
        _ => format!(
            "failedJobsHistoryLimit {}: older than the newest failed Jobs kept",
            spec.failed_jobs_history_limit.unwrap_or(1)
        ),
    }
}

/// The CronJob controller on `informers`, reading the system clock.
pub fn controller(client: Client, informers: &SharedInformers) -> Controller {
    controller_with_clock(client, informers, Arc::new(Utc::now))
}

/// The CronJob controller with its own clock (for tests that move time).
pub fn controller_with_clock(
    client: Client,
    informers: &SharedInformers,
    clock: Clock,
) -> Controller {
    let reconciler = CronJobController {
        events: EventRecorder::new(client.clone(), Reporter::new("cronjob-controller")),
        client,
        cronjobs: informers.typed::<CronJob>(Scope::all()).store(),
        jobs: informers.typed::<Job>(Scope::all()).store(),
        clock,
    };
    Controller::for_type::<CronJob>(NAME, informers, None)
        .owns::<CronJob, Job>(None)
        .build(Arc::new(reconciler))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::batch::v1::{CronJobSpec, CronJobStatus, JobCondition, JobStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().to_utc()
    }

    fn time(s: &str) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(t(s).timestamp()).unwrap())
    }

    fn cronjob(schedule: &str, policy: &str, last: Option<&str>) -> CronJob {
        CronJob {
            metadata: ObjectMeta {
                name: Some("backup".into()),
                namespace: Some("ns".into()),
                uid: Some("cj".into()),
                creation_timestamp: Some(time("2026-01-01T00:00:00Z")),
                ..Default::default()
            },
            spec: Some(CronJobSpec {
                schedule: schedule.into(),
                concurrency_policy: Some(policy.into()),
                ..Default::default()
            }),
            status: last.map(|l| CronJobStatus {
                last_schedule_time: Some(time(l)),
                ..Default::default()
            }),
        }
    }

    fn job(name: &str, created: &str, finished: Option<&str>) -> Arc<Job> {
        Arc::new(Job {
            metadata: ObjectMeta {
                name: Some(name.into()),
                creation_timestamp: Some(time(created)),
                ..Default::default()
            },
            spec: None,
            status: finished.map(|outcome| JobStatus {
                conditions: Some(vec![JobCondition {
                    type_: outcome.into(),
                    status: "True".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        })
    }

    #[test]
    fn creates_the_job_for_the_latest_start_time_once() {
        let cj = cronjob("*/1 * * * *", "Allow", Some("2026-01-01T10:00:00Z"));
        let p = plan(&cj, &[], t("2026-01-01T10:01:30Z")).unwrap();
        let (name, when) = p.create.clone().unwrap();
        assert_eq!(when, t("2026-01-01T10:01:00Z"));
        assert_eq!(name, job_name("backup", when));
        assert_eq!(p.next, Some(t("2026-01-01T10:02:00Z")));
        // The Job exists: nothing more to create for that minute.
        let existing = [job(&name, "2026-01-01T10:01:01Z", None)];
        let again = plan(&cj, &existing, t("2026-01-01T10:01:40Z")).unwrap();
        assert_eq!(again.create, None);
        assert_eq!(again.active, vec![name]);
    }

    #[test]
    fn every_schedules_that_validation_accepts() {
        // Validation and this controller share `setpoint_api::cron`: what one accepts runs.
        let cj = cronjob("@every 5m", "Allow", Some("2026-01-01T10:00:00Z"));
        let p = plan(&cj, &[], t("2026-01-01T10:06:00Z")).unwrap();
        assert_eq!(p.create.unwrap().1, t("2026-01-01T10:05:00Z"));
        // A constant delay counts from now, as robfig's `Next` does upstream.
        assert_eq!(p.next, Some(t("2026-01-01T10:11:00Z")));
        let utc = cronjob("TZ=UTC @hourly", "Allow", Some("2026-01-01T10:00:00Z"));
        assert!(plan(&utc, &[], t("2026-01-01T11:00:30Z"))
            .unwrap()
            .create
            .is_some());
        let bad = cronjob("61 * * * *", "Allow", None);
        assert_eq!(
            plan(&bad, &[], t("2026-01-01T11:00:30Z")).unwrap_err(),
            PlanError::UnparseableSchedule(
                "unparseable schedule: \"61 * * * *\" : end of range (61) above maximum (59): 61"
                    .into()
            )
        );
    }

    #[test]
    fn time_zones_move_the_runs() {
        // 09:00 in Kolkata (UTC+05:30) is 03:30 UTC.
        let mut cj = cronjob("0 9 * * *", "Allow", Some("2026-01-01T00:00:00Z"));
        cj.spec.as_mut().unwrap().time_zone = Some("Asia/Kolkata".into());
        let p = plan(&cj, &[], t("2026-01-01T03:31:00Z")).unwrap();
        assert_eq!(p.create.unwrap().1, t("2026-01-01T03:30:00Z"));
        assert_eq!(p.next, Some(t("2026-01-02T03:30:00Z")));
        let p = plan(&cj, &[], t("2026-01-01T03:29:00Z")).unwrap();
        assert_eq!(p.create, None, "not yet 09:00 there");
        assert_eq!(unsupported_schedule(&cj), None);
        // A TZ= prefix in the schedule is honoured as written, with upstream's warning.
        let paris = cronjob(
            "TZ=Europe/Paris 0 9 * * *",
            "Allow",
            Some("2026-01-01T00:00:00Z"),
        );
        assert_eq!(
            unsupported_schedule(&paris).unwrap(),
            "CRON_TZ or TZ used in schedule \"TZ=Europe/Paris 0 9 * * *\" is not officially supported, see https://kubernetes.io/docs/concepts/workloads/controllers/cron-jobs/ for more details"
        );
        let p = plan(&paris, &[], t("2026-01-01T08:00:30Z")).unwrap();
        assert_eq!(p.create.unwrap().1, t("2026-01-01T08:00:00Z"));
        // An unknown zone starts nothing and says why.
        cj.spec.as_mut().unwrap().time_zone = Some("Mars/Olympus".into());
        let e = plan(&cj, &[], t("2026-01-01T03:31:00Z")).unwrap_err();
        assert_eq!(e.reason(), "UnknownTimeZone");
        assert_eq!(
            e.to_string(),
            "invalid timeZone: \"Mars/Olympus\": unknown time zone Mars/Olympus"
        );
    }

    #[test]
    fn nothing_before_the_first_start_time() {
        let cj = cronjob("0 2 * * *", "Allow", None);
        let p = plan(&cj, &[], t("2026-01-01T01:00:00Z")).unwrap();
        assert_eq!(p.create, None);
        assert_eq!(p.next, Some(t("2026-01-01T02:00:00Z")));
    }

    #[test]
    fn concurrency_policies() {
        let running = [job("backup-1", "2026-01-01T10:00:00Z", None)];
        let now = t("2026-01-01T10:01:10Z");
        let forbid = plan(
            &cronjob("*/1 * * * *", "Forbid", Some("2026-01-01T10:00:00Z")),
            &running,
            now,
        )
        .unwrap();
        assert_eq!(forbid.create, None);
        assert_eq!(forbid.skipped.unwrap().0, "JobAlreadyActive");
        let replace = plan(
            &cronjob("*/1 * * * *", "Replace", Some("2026-01-01T10:00:00Z")),
            &running,
            now,
        )
        .unwrap();
        assert!(replace.create.is_some());
        assert_eq!(replace.replace, vec!["backup-1".to_string()]);
        let allow = plan(
            &cronjob("*/1 * * * *", "Allow", Some("2026-01-01T10:00:00Z")),
            &running,
            now,
        )
        .unwrap();
        assert!(allow.create.is_some() && allow.replace.is_empty());
    }

    #[test]
    fn missed_deadline_and_many_missed_times() {
        let mut cj = cronjob("*/1 * * * *", "Allow", Some("2026-01-01T10:00:00Z"));
        cj.spec.as_mut().unwrap().starting_deadline_seconds = Some(10);
        let p = plan(&cj, &[], t("2026-01-01T10:01:30Z")).unwrap();
        assert_eq!(p.create, None);
        assert_eq!(p.skipped.unwrap().0, "MissSchedule");
        // Down for a day: only the latest start runs.
        let cj = cronjob("*/1 * * * *", "Allow", Some("2026-01-01T10:00:00Z"));
        let p = plan(&cj, &[], t("2026-01-02T10:00:30Z")).unwrap();
        assert_eq!(p.create.unwrap().1, t("2026-01-02T10:00:00Z"));
        assert_eq!(p.skipped.unwrap().0, "TooManyMissedTimes");
    }

    #[test]
    fn history_limits_prune_the_oldest_finished_jobs() {
        let cj = cronjob("0 0 1 1 *", "Allow", Some("2026-01-01T00:00:00Z"));
        let jobs: Vec<Arc<Job>> = (0..5)
            .map(|i| {
                job(
                    &format!("ok-{i}"),
                    &format!("2026-01-01T0{i}:00:00Z"),
                    Some("Complete"),
                )
            })
            .chain((0..3).map(|i| {
                job(
                    &format!("bad-{i}"),
                    &format!("2026-01-01T0{i}:30:00Z"),
                    Some("Failed"),
                )
            }))
            .collect();
        let mut p = plan(&cj, &jobs, t("2026-01-01T12:00:00Z")).unwrap();
        p.prune.sort();
        assert_eq!(p.prune, vec!["bad-0", "bad-1", "ok-0", "ok-1"]);
    }

    #[test]
    fn suspended_and_invalid() {
        let mut cj = cronjob("*/1 * * * *", "Allow", Some("2026-01-01T10:00:00Z"));
        cj.spec.as_mut().unwrap().suspend = Some(true);
        assert_eq!(
            plan(&cj, &[], t("2026-01-01T10:05:00Z")).unwrap().create,
            None
        );
        let bad = cronjob("61 * * * *", "Allow", None);
        assert!(plan(&bad, &[], t("2026-01-01T10:05:00Z")).is_err());
    }
}
