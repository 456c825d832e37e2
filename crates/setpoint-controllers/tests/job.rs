//! The Job controller against a real in-process API server, with the test acting as the node
//! (it finishes pods through the status subresource).

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use setpoint_runtime::client::{Api, ListParams, Patch, PatchParams, PostParams};
use setpoint_testing::{eventually, TestCluster};

fn job(name: &str, completions: i32, parallelism: i32, backoff_limit: i32) -> Job {
    serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name},
        "spec": {"completions": completions, "parallelism": parallelism, "backoffLimit": backoff_limit,
                 "template": {"spec": {"restartPolicy": "Never",
                     "containers": [{"name": "work", "image": "busybox", "command": ["true"]}]}}}
    }))
    .unwrap()
}

async fn finish(pods: &Api<Pod>, name: &str, phase: &str) {
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": phase}})),
    )
    .await
    .unwrap();
}

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

#[tokio::test]
async fn job_runs_pods_to_completion_within_parallelism() {
    let cluster = TestCluster::start_with_controllers().await;
    let client = cluster.client();
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    jobs.create(&PostParams::default(), &job("three", 3, 2, 6))
        .await
        .unwrap();
    let selector = "job-name=three";
    let mut finished = 0;
    while finished < 3 {
        // Finish one running pod at a time; never more than `parallelism` run at once.
        let running = eventually("a running pod of the Job", || async {
            let list = pods
                .list(&ListParams::default().labels(selector))
                .await
                .unwrap();
            let active: Vec<Pod> = list
                .items
                .into_iter()
                .filter(|p| !matches!(phase(p), "Succeeded" | "Failed"))
                .collect();
            assert!(active.len() <= 2, "{} pods active at once", active.len());
            active.into_iter().next()
        })
        .await;
        finish(
            &pods,
            running.metadata.name.as_deref().unwrap(),
            "Succeeded",
        )
        .await;
        finished += 1;
    }
    let done = eventually("the Job to complete", || async {
        let j = jobs.get("three").await.unwrap();
        let s = j.status.clone()?;
        s.conditions
            .as_ref()?
            .iter()
            .any(|c| c.type_ == "Complete" && c.status == "True")
            .then_some(s)
    })
    .await;
    assert_eq!(done.succeeded, Some(3));
    assert!(done.completion_time.is_some());
    let all = pods
        .list(&ListParams::default().labels(selector))
        .await
        .unwrap();
    assert_eq!(all.items.len(), 3, "exactly one pod per completion");
    cluster.stop().await;
}

#[tokio::test]
async fn job_fails_after_its_backoff_limit() {
    let cluster = TestCluster::start_with_controllers().await;
    let client = cluster.client();
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    jobs.create(&PostParams::default(), &job("doomed", 1, 1, 0))
        .await
        .unwrap();
    let first = eventually("the Job's pod", || async {
        pods.list(&ListParams::default().labels("job-name=doomed"))
            .await
            .unwrap()
            .items
            .into_iter()
            .next()
    })
    .await;
    finish(&pods, first.metadata.name.as_deref().unwrap(), "Failed").await;
    let failed = eventually("the Job to fail", || async {
        let j = jobs.get("doomed").await.unwrap();
        j.status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "Failed" && c.status == "True")
    })
    .await;
    assert_eq!(failed.reason.as_deref(), Some("BackoffLimitExceeded"));
    cluster.stop().await;
}
