//! The CronJob controller against a real in-process API server, on a clock the test moves:
//! each minute of the schedule creates exactly one Job, named for its minute, and a schedule
//! in a `timeZone` runs at that zone's wall-clock time.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Duration, Timelike, Utc};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use serde_json::json;
use setpoint_runtime::client::{Api, ListParams, Patch, PatchParams, PostParams};
use setpoint_runtime::decision::{self, DecisionRecord};
use setpoint_runtime::informer::SharedInformers;
use setpoint_testing::{eventually, TestCluster};

/// The finished decision records of the `cronjob` controller about `{ns}/{name}` so far.
fn decisions(ns: &str, name: &str) -> Vec<Arc<DecisionRecord>> {
    decision::ring()
        .about("cronjob", name)
        .into_iter()
        .filter(|r| r.object.namespace == ns)
        .collect()
}

#[tokio::test]
async fn every_minute_creates_one_job() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let clock = Arc::new(Mutex::new(Utc::now()));
    let read = clock.clone();
    let informers = SharedInformers::new(client.clone());
    let controller = setpoint_controllers::cronjob::controller_with_clock(
        client.clone(),
        &informers,
        Arc::new(move || *read.lock().unwrap()),
    );
    let task = tokio::spawn(controller.run(std::future::pending()));

    let cronjobs: Api<CronJob> = Api::namespaced(client.clone(), "default");
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let cj: CronJob = serde_json::from_value(json!({
        "metadata": {"name": "tick"},
        "spec": {"schedule": "*/1 * * * *", "successfulJobsHistoryLimit": 5,
                 "jobTemplate": {"spec": {"template": {"spec": {"restartPolicy": "Never",
                     "containers": [{"name": "c", "image": "busybox", "command": ["true"]}]}}}}}
    }))
    .unwrap();
    cronjobs.create(&PostParams::default(), &cj).await.unwrap();

    let mut expected = Vec::new();
    for step in 1..=3 {
        // Move to 5 s past the next minute, and wake the controller.
        let next: DateTime<Utc> = {
            let mut now = clock.lock().unwrap();
            let minute =
                now.with_second(0).unwrap().with_nanosecond(0).unwrap() + Duration::minutes(1);
            *now = minute + Duration::seconds(5);
            minute
        };
        expected.push(format!("tick-{}", next.timestamp() / 60));
        cronjobs
            .patch(
                "tick",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {"step": step.to_string()}}})),
            )
            .await
            .unwrap();
        let names = eventually("the Job of this minute", || async {
            let names: Vec<String> = jobs
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .filter_map(|j| j.metadata.name)
                .collect();
            (names.len() == expected.len()).then_some(names)
        })
        .await;
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(sorted, expected, "one Job per minute, named for it");
    }
    let status = cronjobs.get("tick").await.unwrap().status.unwrap();
    assert!(status.last_schedule_time.is_some());
    assert_eq!(status.active.unwrap_or_default().len(), 3);
    // The decision that made the last Job says what it saw and which rule chose it.
    let last = expected.last().unwrap().clone();
    let record = eventually("the decision record creating the last Job", || async {
        decisions("default", "tick").into_iter().find(|r| {
            r.actions
                .iter()
                .any(|a| a.action == format!("create job {last}"))
        })
    })
    .await;
    assert!(
        record
            .observed
            .iter()
            .any(|o| o.starts_with("schedule \"*/1 * * * *\" in UTC; now ")
                && o.contains(" active job(s)")),
        "{record:?}"
    );
    let create = record
        .actions
        .iter()
        .find(|a| a.action.starts_with("create job "))
        .unwrap();
    assert!(
        create.rule.starts_with("scheduled time ")
            && create
                .rule
                .ends_with(" is due and has no Job; concurrencyPolicy Allow"),
        "{create:?}"
    );
    task.abort();
    cluster.stop().await;
}

#[tokio::test]
async fn a_schedule_in_a_time_zone_runs_at_that_zones_time() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    // 09:30 in Kolkata (UTC+05:30) is 04:00 UTC: the next one at least a minute away.
    let mut due = Utc::now()
        .with_hour(4)
        .and_then(|t| t.with_minute(0))
        .and_then(|t| t.with_second(0))
        .and_then(|t| t.with_nanosecond(0))
        .unwrap();
    if due <= Utc::now() + Duration::minutes(1) {
        due += Duration::days(1);
    }
    let clock = Arc::new(Mutex::new(Utc::now()));
    let read = clock.clone();
    let informers = SharedInformers::new(client.clone());
    let controller = setpoint_controllers::cronjob::controller_with_clock(
        client.clone(),
        &informers,
        Arc::new(move || *read.lock().unwrap()),
    );
    let task = tokio::spawn(controller.run(std::future::pending()));
    let cronjobs: Api<CronJob> = Api::namespaced(client.clone(), "default");
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let template = json!({"spec": {"template": {"spec": {"restartPolicy": "Never",
        "containers": [{"name": "c", "image": "busybox", "command": ["true"]}]}}}});
    let cj: CronJob = serde_json::from_value(json!({
        "metadata": {"name": "kolkata"},
        "spec": {"schedule": "30 9 * * *", "timeZone": "Asia/Kolkata", "jobTemplate": template}
    }))
    .unwrap();
    cronjobs.create(&PostParams::default(), &cj).await.unwrap();
    // Read in UTC, 09:30 would be hours away: the run at 04:00 UTC shows the zone applied.
    *clock.lock().unwrap() = due + Duration::seconds(5);
    cronjobs
        .patch(
            "kolkata",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"wake": "1"}}})),
        )
        .await
        .unwrap();
    let job = format!("kolkata-{}", due.timestamp() / 60);
    eventually("the Job of 09:30 Kolkata time", || async {
        jobs.get_opt(&job).await.unwrap()
    })
    .await;
    let last = eventually("lastScheduleTime", || async {
        cronjobs
            .get("kolkata")
            .await
            .unwrap()
            .status?
            .last_schedule_time
    })
    .await;
    assert_eq!(last.0.as_second(), due.timestamp());
    assert_eq!(
        jobs.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    task.abort();
    cluster.stop().await;
}
