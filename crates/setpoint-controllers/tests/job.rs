//! The Job controller against a real in-process API server, with the test acting as the node
//! (it finishes pods through the status subresource).

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use setpoint_runtime::client::{
    Api, Body, Client, ClientError, DeleteParams, ListParams, Patch, PatchParams, PostParams,
    ServiceTransport, Transport,
};
use setpoint_runtime::informer::{Scope, SharedInformers};
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

fn now() -> DeleteParams {
    DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    }
}

fn tracked(p: &Pod) -> bool {
    p.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == "batch.kubernetes.io/job-tracking")
}

#[tokio::test]
async fn job_counts_survive_its_pods_through_the_tracking_finalizer() {
    let cluster = TestCluster::start_with_controllers().await;
    let client = cluster.client();
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    jobs.create(&PostParams::default(), &job("tracked", 3, 2, 6))
        .await
        .unwrap();
    let list = |pods: Api<Pod>| async move {
        pods.list(&ListParams::default().labels("job-name=tracked"))
            .await
            .unwrap()
            .items
    };
    let two = eventually("two pods", || async {
        let items = list(pods.clone()).await;
        (items.len() == 2).then_some(items)
    })
    .await;
    assert!(two.iter().all(tracked), "every pod carries the finalizer");
    let (done, running) = (
        two[0].metadata.name.clone().unwrap(),
        two[1].metadata.name.clone().unwrap(),
    );
    // A succeeded pod is counted, then loses its finalizer; deleting it keeps the count.
    finish(&pods, &done, "Succeeded").await;
    eventually("the success counted and the finalizer gone", || async {
        let s = jobs.get("tracked").await.unwrap().status?;
        let p = pods.get(&done).await.unwrap();
        let flushed = s.uncounted_terminated_pods.as_ref()?.succeeded.is_none();
        (s.succeeded == Some(1) && flushed && !tracked(&p)).then_some(())
    })
    .await;
    pods.delete(&done, &now()).await.unwrap();
    // A pod deleted while running waits for the controller, then counts as failed.
    pods.delete(&running, &now()).await.unwrap();
    let s = eventually("both pods gone and counted", || async {
        let items = list(pods.clone()).await;
        let names: Vec<String> = items
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect();
        let s = jobs.get("tracked").await.unwrap().status?;
        (!names.contains(&done) && !names.contains(&running) && s.failed == Some(1)).then_some(s)
    })
    .await;
    assert_eq!(
        s.succeeded,
        Some(1),
        "the deleted pod's success stays counted"
    );
    // The Job deleted: its remaining pods do not stay stuck on the finalizer.
    eventually("replacements", || async {
        (!list(pods.clone()).await.is_empty()).then_some(())
    })
    .await;
    jobs.delete(
        "tracked",
        &DeleteParams {
            propagation_policy: Some("Orphan".into()),
            ..DeleteParams::default()
        },
    )
    .await
    .unwrap();
    eventually("the orphans released", || async {
        let items = list(pods.clone()).await;
        (!items.is_empty() && items.iter().all(|p| !tracked(p))).then_some(())
    })
    .await;
    cluster.stop().await;
}

/// Holds pod creates past the first `open` until released: the test decides exactly which
/// batch is in flight when the Job is deleted.
struct PodCreateGate {
    inner: Box<dyn Transport>,
    open: usize,
    arrived: AtomicUsize,
    released: tokio::sync::watch::Sender<bool>,
}

#[async_trait::async_trait]
impl Transport for PodCreateGate {
    async fn send(
        &self,
        req: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<Body>, ClientError> {
        if req.method() == http::Method::POST && req.uri().path().ends_with("/pods") {
            let n = self.arrived.fetch_add(1, Ordering::SeqCst);
            if n >= self.open {
                let mut released = self.released.subscribe();
                let _ = released.wait_for(|r| *r).await;
            }
        }
        self.inner.send(req).await
    }
}

/// A Job asking for as many pods as the API allows, deleted with background propagation as
/// the next request, or (with `in_flight`) while the controller's slow-start batch after
/// `in_flight - 1` pods (1 + 2 + 4 … = 2^k - 1) is held at the server's door. Returns how many
/// pods were created after the deletion, and in all.
async fn flood_then_delete(in_flight: Option<usize>) -> (usize, usize) {
    use setpoint_testing::ChangeKind;

    let mut cluster = TestCluster::start().await;
    let (released, _) = tokio::sync::watch::channel(false);
    let gate = Arc::new(PodCreateGate {
        inner: Box::new(ServiceTransport::new(setpoint_apiserver::http::router(
            cluster.server().clone(),
        ))),
        open: in_flight.map_or(usize::MAX, |n| n - 1),
        arrived: AtomicUsize::new(0),
        released,
    });
    let gated = Client::new(SharedTransport(gate.clone()));
    let informers = SharedInformers::lean(gated.clone());
    cluster.start_controllers_with(gated, Default::default(), informers.clone());
    let jobs: Api<Job> = Api::namespaced(cluster.client(), "default");
    let start = cluster.revision().await;
    jobs.create(&PostParams::default(), &job("flood", i32::MAX, i32::MAX, 6))
        .await
        .unwrap();
    if let Some(n) = in_flight {
        // The whole batch (n creates after the n - 1 before it) is waiting at the gate.
        let want = 2 * n - 1;
        tokio::time::timeout(Duration::from_secs(30), async {
            while gate.arrived.load(Ordering::SeqCst) < want {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("the batch to reach the server");
    }
    let background = DeleteParams {
        propagation_policy: Some("Background".into()),
        ..DeleteParams::default()
    };
    jobs.delete("flood", &background).await.unwrap();
    gate.released.send_replace(true);
    // Once the controllers' cache has no Job, no reconcile starts creating again; stopping
    // them waits for the reconciles in flight, which must end within the batch, not go on.
    let cached = informers.typed::<Job>(Scope::all()).store();
    eventually("the controllers to see the Job gone", || async {
        cached.is_empty().then_some(())
    })
    .await;
    tokio::time::timeout(Duration::from_secs(30), cluster.stop_controllers())
        .await
        .expect("the Job controller stops: no reconcile goes on creating pods");
    informers.shutdown().await;
    // The store's history has every pod ever created, also those collected since.
    let history = cluster.history("/registry/", start).await;
    let deleted_at = history
        .iter()
        .find(|c| c.key == "/registry/batch/jobs/default/flood" && c.kind == ChangeKind::Deleted)
        .expect("the Job's deletion")
        .revision;
    let created: Vec<i64> = history
        .iter()
        .filter(|c| {
            c.key.starts_with("/registry/core/pods/default/") && c.kind == ChangeKind::Created
        })
        .map(|c| c.revision)
        .collect();
    cluster.stop().await;
    let after = created.iter().filter(|r| **r > deleted_at).count();
    (after, created.len())
}

/// One transport behind an `Arc`, so the test keeps a handle on the gate.
struct SharedTransport(Arc<PodCreateGate>);

#[async_trait::async_trait]
impl Transport for SharedTransport {
    async fn send(
        &self,
        req: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<Body>, ClientError> {
        self.0.send(req).await
    }
}

/// The most pods one slow-start batch can create: a batch in flight when the Job is deleted
/// is all that may follow the deletion.
fn largest_batch() -> usize {
    setpoint_controllers::replicaset::batches(
        setpoint_controllers::job::MAX_POD_CREATE_DELETE_PER_SYNC,
    )
    .into_iter()
    .max()
    .unwrap()
}

#[tokio::test]
async fn a_huge_job_deleted_at_once_stops_within_one_batch() {
    let (after, total) = flood_then_delete(None).await;
    assert!(
        after <= largest_batch(),
        "{after} pods created after the Job was deleted ({total} in all)"
    );
}

#[tokio::test]
async fn a_huge_job_deleted_while_a_batch_is_in_flight_gets_only_that_batch() {
    // Batches 1, 2 and 4 pass; the batch of 8 is in flight when the Job is deleted.
    let (after, total) = flood_then_delete(Some(8)).await;
    assert_eq!(after, 8, "only the batch in flight follows the deletion");
    assert_eq!(total, 15);
}
