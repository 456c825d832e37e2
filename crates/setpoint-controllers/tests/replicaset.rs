//! The ReplicaSet controller against a real in-process API server.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use serde_json::json;
use setpoint_api::ApiError;
use setpoint_runtime::client::{
    Api, Client, ClientError, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent,
    WatchParams,
};
use setpoint_runtime::client::{Body, ServiceTransport, Transport};
use setpoint_runtime::informer::SharedInformers;
use setpoint_testing::TestCluster;

const NS: &str = "rs";

/// A transport that refuses and counts pod creates (as an exhausted quota would).
struct FailPodCreates<T>(T, Arc<AtomicUsize>);

#[async_trait::async_trait]
impl<T: Transport> Transport for FailPodCreates<T> {
    async fn send(&self, req: http::Request<Bytes>) -> Result<http::Response<Body>, ClientError> {
        if req.method() == http::Method::POST && req.uri().path().ends_with("/pods") {
            self.1.fetch_add(1, Ordering::SeqCst);
            return Err(ClientError::Api(ApiError::new(
                403,
                "Forbidden",
                "exceeded quota: pods",
            )));
        }
        self.0.send(req).await
    }
}

/// A transport that lets only a fixed number of pod creates through and holds the rest, so
/// that a scale-up stops half-way at a known point.
struct GatedPodCreates<T>(T, Arc<tokio::sync::Semaphore>);

#[async_trait::async_trait]
impl<T: Transport> Transport for GatedPodCreates<T> {
    async fn send(&self, req: http::Request<Bytes>) -> Result<http::Response<Body>, ClientError> {
        if req.method() == http::Method::POST && req.uri().path().ends_with("/pods") {
            // Each create uses up a permit; once they are gone, creates wait forever.
            if let Ok(permit) = self.1.acquire().await {
                permit.forget();
            }
        }
        self.0.send(req).await
    }
}

/// A client through which only `creates` pod creates go through.
fn gated_client(cluster: &TestCluster, creates: usize) -> Client {
    let router = setpoint_apiserver::http::router(cluster.server().clone());
    Client::new(GatedPodCreates(
        ServiceTransport::new(router),
        Arc::new(tokio::sync::Semaphore::new(creates)),
    ))
}

/// Starts a fresh ReplicaSet controller (with its own informers); it stops when the returned
/// task is aborted.
fn start_controller(client: &Client) -> tokio::task::JoinHandle<()> {
    let informers = SharedInformers::new(client.clone());
    let c = setpoint_controllers::replicaset::controller(client.clone(), &informers);
    tokio::spawn(async move {
        c.run(std::future::pending()).await;
        informers.shutdown().await;
    })
}

/// Polls `check` until it returns `Some`, or panics after 30 s.
async fn eventually<T, F: Future<Output = Option<T>>>(what: &str, check: impl FnMut() -> F) -> T {
    setpoint_testing::eventually_within(Duration::from_secs(30), what, check).await
}

async fn setup() -> (TestCluster, Api<ReplicaSet>, Api<Pod>) {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let sets = Api::namespaced(client.clone(), NS);
    let pods = Api::namespaced(client, NS);
    (cluster, sets, pods)
}

async fn create_rs(api: &Api<ReplicaSet>, replicas: i32) -> ReplicaSet {
    let rs: ReplicaSet = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}, "annotations": {"note": "x"}},
                "spec": {"containers": [{"name": "c", "image": "nginx"}]}
            }
        }
    }))
    .unwrap();
    api.create(&PostParams::default(), &rs).await.unwrap()
}

/// The pods that are not being deleted.
async fn live_pods(api: &Api<Pod>) -> Vec<Pod> {
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

async fn wait_count(api: &Api<Pod>, n: usize) -> Vec<Pod> {
    eventually(&format!("{n} pods"), || async {
        let pods = live_pods(api).await;
        (pods.len() == n).then_some(pods)
    })
    .await
}

async fn scale(api: &Api<ReplicaSet>, n: i32) {
    api.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": n}})),
    )
    .await
    .unwrap();
}

/// Marks a pod Running and Ready, as a node would.
async fn make_ready(api: &Api<Pod>, name: &str) {
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True",
                            "lastTransitionTime": "2020-01-01T00:00:00Z"}]
        }})),
    )
    .await
    .unwrap();
}

async fn wait_status(api: &Api<ReplicaSet>, f: impl Fn(&ReplicaSet) -> bool) -> ReplicaSet {
    eventually("replica set status", || async {
        let rs = api.get("web").await.unwrap();
        f(&rs).then_some(rs)
    })
    .await
}

fn field(
    rs: &ReplicaSet,
    f: impl Fn(&k8s_openapi::api::apps::v1::ReplicaSetStatus) -> Option<i32>,
) -> i32 {
    rs.status.as_ref().and_then(f).unwrap_or(0)
}

#[tokio::test]
async fn keeps_replicas_scales_and_reports_status() {
    let (cluster, sets, pods) = setup().await;
    let task = start_controller(&cluster.client());
    let rs = create_rs(&sets, 3).await;
    let uid = rs.metadata.uid.clone().unwrap();

    let created = wait_count(&pods, 3).await;
    for p in &created {
        let refs = p.metadata.owner_references.clone().unwrap_or_default();
        assert_eq!(refs.len(), 1);
        assert_eq!(refs[0].uid, uid);
        assert_eq!(refs[0].controller, Some(true));
        assert_eq!(refs[0].block_owner_deletion, Some(true));
        assert!(p.metadata.name.as_ref().unwrap().starts_with("web-"));
        assert_eq!(
            p.metadata
                .annotations
                .as_ref()
                .unwrap()
                .get("note")
                .map(String::as_str),
            Some("x")
        );
    }
    wait_status(&sets, |rs| {
        rs.status.as_ref().is_some_and(|s| s.replicas == 3)
    })
    .await;

    // A deleted pod is replaced.
    let victim = created[0].metadata.name.clone().unwrap();
    pods.delete(&victim, &DeleteParams::default())
        .await
        .unwrap();
    let after = eventually("replacement", || async {
        let ps = live_pods(&pods).await;
        (ps.len() == 3
            && ps
                .iter()
                .all(|p| p.metadata.name.as_deref() != Some(victim.as_str())))
        .then_some(ps)
    })
    .await;

    // Ready pods are counted.
    let ready: Vec<String> = after[..2]
        .iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    for n in &ready {
        make_ready(&pods, n).await;
    }
    let rs = wait_status(&sets, |rs| field(rs, |s| s.ready_replicas) == 2).await;
    assert_eq!(field(&rs, |s| s.available_replicas), 2);
    assert_eq!(
        rs.status.as_ref().unwrap().observed_generation,
        rs.metadata.generation
    );

    // Scaling up to 5, then down to 1: the one left is a ready pod, the not-ready ones go first.
    scale(&sets, 5).await;
    wait_count(&pods, 5).await;
    scale(&sets, 1).await;
    let left = wait_count(&pods, 1).await;
    assert!(ready.contains(left[0].metadata.name.as_ref().unwrap()));
    let rs = wait_status(&sets, |rs| {
        rs.status.as_ref().is_some_and(|s| s.replicas == 1)
    })
    .await;
    assert_eq!(field(&rs, |s| s.ready_replicas), 1);

    task.abort();
    cluster.stop().await;
}

#[tokio::test]
async fn adopts_matching_orphans() {
    let (cluster, sets, pods) = setup().await;
    let orphan: Pod = serde_json::from_value(json!({
        "metadata": {"name": "orphan", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &orphan).await.unwrap();
    let rs = create_rs(&sets, 2).await;
    let task = start_controller(&cluster.client());

    let all = wait_count(&pods, 2).await;
    assert!(all
        .iter()
        .any(|p| p.metadata.name.as_deref() == Some("orphan")));
    let adopted = eventually("adoption", || async {
        let p = pods.get("orphan").await.unwrap();
        p.metadata.owner_references.filter(|r| !r.is_empty())
    })
    .await;
    assert_eq!(adopted[0].uid, rs.metadata.uid.unwrap());
    assert_eq!(adopted[0].controller, Some(true));

    task.abort();
    cluster.stop().await;
}

#[tokio::test]
async fn a_restarted_controller_does_not_duplicate_pods() {
    let (cluster, sets, pods) = setup().await;
    create_rs(&sets, 0).await;
    let first = start_controller(&gated_client(&cluster, 5));
    // The controller has synced once it reports the ReplicaSet's status.
    wait_status(&sets, |rs| {
        rs.status
            .as_ref()
            .is_some_and(|s| s.observed_generation == rs.metadata.generation)
    })
    .await;
    let watch = pods.watch(&WatchParams::default(), "").await.unwrap();
    futures::pin_mut!(watch);
    scale(&sets, 50).await;
    // Stop the controller mid scale-up: once a few of its batches went through.
    tokio::time::timeout(Duration::from_secs(30), async {
        let mut added = 0;
        while let Some(ev) = watch.next().await {
            if matches!(ev, Ok(WatchEvent::Added(_))) {
                added += 1;
                if added >= 5 {
                    return;
                }
            }
        }
    })
    .await
    .expect("scale-up started");
    first.abort();
    let _ = first.await;
    let stopped = live_pods(&pods).await.len();
    eprintln!("controller stopped with {stopped} of 50 pods");
    assert!(stopped < 50, "the controller was stopped mid scale-up");
    let _second = start_controller(&cluster.client());
    wait_count(&pods, 50).await;
    // Once the controller reports 50 (its view after its last creates), there are 50.
    let rs = wait_status(&sets, |rs| {
        rs.status.as_ref().is_some_and(|s| s.replicas == 50)
    })
    .await;
    assert_eq!(live_pods(&pods).await.len(), 50);
    assert_eq!(field(&rs, |s| s.fully_labeled_replicas), 50);

    cluster.stop().await;
}

#[tokio::test]
async fn a_failing_create_is_reported_without_flooding() {
    let (cluster, sets, pods) = setup().await;
    let attempts = Arc::new(AtomicUsize::new(0));
    let router = setpoint_apiserver::http::router(cluster.server().clone());
    let client = Client::new(FailPodCreates(
        ServiceTransport::new(router),
        attempts.clone(),
    ));
    create_rs(&sets, 20).await;
    let task = start_controller(&client);

    let rs = wait_status(&sets, |rs| {
        rs.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| !c.is_empty())
    })
    .await;
    let cond = &rs.status.unwrap().conditions.unwrap()[0];
    assert_eq!(cond.type_, "ReplicaFailure");
    assert_eq!(cond.status, "True");
    assert_eq!(cond.reason.as_deref(), Some("FailedCreate"));
    assert!(live_pods(&pods).await.is_empty());
    // Slow start: each pass (retried with backoff) stops at its first failure, one request,
    // where creating all twenty at once would have sent twenty. Seen as soon as a second
    // pass has begun.
    let n = eventually("a retried pass", || async {
        let n = attempts.load(Ordering::SeqCst);
        (n >= 2).then_some(n)
    })
    .await;
    assert!(n < 20, "{n} create attempts");

    task.abort();
    cluster.stop().await;
}
