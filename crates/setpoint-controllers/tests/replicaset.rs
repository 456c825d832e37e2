//! The ReplicaSet controller against a real in-process API server, and the
//! ReplicationController controller (the same controller over an adapter) through the same
//! scenarios: every scenario is a generic function run once per kind (`both!`).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetStatus};
use k8s_openapi::api::core::v1::{Namespace, Pod, ReplicationController};
use serde_json::json;
use setpoint_api::ApiError;
use setpoint_controllers::replicaset::Replicated;
use setpoint_runtime::client::{
    Api, Client, ClientError, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent,
    WatchParams,
};
use setpoint_runtime::client::{Body, ServiceTransport, Transport};
use setpoint_runtime::informer::SharedInformers;
use setpoint_testing::TestCluster;

/// A kind the scenarios run for: how to write one selecting `app: web`.
trait Kind: Replicated {
    /// `selector` in this kind's form: a label selector or an equality map.
    fn selector() -> serde_json::Value;
}

impl Kind for ReplicaSet {
    fn selector() -> serde_json::Value {
        json!({"matchLabels": {"app": "web"}})
    }
}

impl Kind for ReplicationController {
    fn selector() -> serde_json::Value {
        json!({"app": "web"})
    }
}

/// Runs a generic scenario as one test per kind.
macro_rules! both {
    ($scenario:ident, $rs:ident, $rc:ident) => {
        #[tokio::test]
        async fn $rs() {
            $scenario::<ReplicaSet>().await
        }
        #[tokio::test]
        async fn $rc() {
            $scenario::<ReplicationController>().await
        }
    };
}

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

/// Starts a fresh controller of `K` (with its own informers); it stops when the returned
/// task is aborted.
fn start_controller<K: Kind>(client: &Client) -> tokio::task::JoinHandle<()> {
    let informers = SharedInformers::new(client.clone());
    let c = setpoint_controllers::replicaset::controller_for::<K>(client.clone(), &informers);
    tokio::spawn(async move {
        c.run(std::future::pending()).await;
        informers.shutdown().await;
    })
}

/// Polls `check` until it returns `Some`, or panics after 30 s.
async fn eventually<T, F: Future<Output = Option<T>>>(what: &str, check: impl FnMut() -> F) -> T {
    setpoint_testing::eventually_within(Duration::from_secs(30), what, check).await
}

async fn setup<K: Kind>() -> (TestCluster, Api<K>, Api<Pod>) {
    setup_on(TestCluster::start().await).await
}

async fn setup_on<K: Kind>(cluster: TestCluster) -> (TestCluster, Api<K>, Api<Pod>) {
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

async fn create_rs<K: Kind>(api: &Api<K>, replicas: i32) -> K {
    let rs: K = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": replicas,
            "selector": K::selector(),
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

async fn scale<K: Kind>(api: &Api<K>, n: i32) {
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

/// Waits until the object (read as a ReplicaSet) satisfies `f`.
async fn wait_status<K: Kind>(api: &Api<K>, f: impl Fn(&ReplicaSet) -> bool) -> ReplicaSet {
    eventually("replica set status", || async {
        let rs = api.get("web").await.unwrap().as_replica_set();
        f(&rs).then_some(rs)
    })
    .await
}

fn field(rs: &ReplicaSet, f: impl Fn(&ReplicaSetStatus) -> Option<i32>) -> i32 {
    rs.status.as_ref().and_then(f).unwrap_or(0)
}

both!(
    keeps_replicas_scales_and_reports_status,
    rs_keeps_replicas_scales_and_reports_status,
    rc_keeps_replicas_scales_and_reports_status
);
async fn keeps_replicas_scales_and_reports_status<K: Kind>() {
    let (cluster, sets, pods) = setup::<K>().await;
    let task = start_controller::<K>(&cluster.client());
    let rs = create_rs(&sets, 3).await;
    let uid = rs.uid().unwrap();

    let created = wait_count(&pods, 3).await;
    for p in &created {
        let refs = p.metadata.owner_references.clone().unwrap_or_default();
        assert_eq!(refs.len(), 1);
        assert_eq!(refs[0].uid, uid);
        assert_eq!(
            (refs[0].api_version.as_str(), refs[0].kind.as_str()),
            (K::API_VERSION, K::KIND)
        );
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

both!(
    adopts_matching_orphans,
    rs_adopts_matching_orphans,
    rc_adopts_matching_orphans
);
async fn adopts_matching_orphans<K: Kind>() {
    let (cluster, sets, pods) = setup::<K>().await;
    let orphan: Pod = serde_json::from_value(json!({
        "metadata": {"name": "orphan", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &orphan).await.unwrap();
    let rs = create_rs(&sets, 2).await;
    let task = start_controller::<K>(&cluster.client());

    let all = wait_count(&pods, 2).await;
    assert!(all
        .iter()
        .any(|p| p.metadata.name.as_deref() == Some("orphan")));
    let adopted = eventually("adoption", || async {
        let p = pods.get("orphan").await.unwrap();
        p.metadata.owner_references.filter(|r| !r.is_empty())
    })
    .await;
    assert_eq!(adopted[0].uid, rs.uid().unwrap());
    assert_eq!(adopted[0].kind, K::KIND);
    assert_eq!(adopted[0].controller, Some(true));

    task.abort();
    cluster.stop().await;
}

both!(
    releases_pods_that_stop_matching,
    rs_releases_pods_that_stop_matching,
    rc_releases_pods_that_stop_matching
);
async fn releases_pods_that_stop_matching<K: Kind>() {
    let (cluster, sets, pods) = setup::<K>().await;
    let task = start_controller::<K>(&cluster.client());
    create_rs(&sets, 2).await;
    let created = wait_count(&pods, 2).await;
    let name = created[0].metadata.name.clone().unwrap();
    // Relabelled out of the selector: released (no owner left), and replaced.
    pods.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "debug"}}})),
    )
    .await
    .unwrap();
    eventually("release", || async {
        let p = pods.get(&name).await.unwrap();
        p.metadata
            .owner_references
            .unwrap_or_default()
            .is_empty()
            .then_some(())
    })
    .await;
    eventually("a replacement", || async {
        let matching = live_pods(&pods)
            .await
            .into_iter()
            .filter(|p| {
                p.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("app"))
                    .map(String::as_str)
                    == Some("web")
            })
            .count();
        (matching == 2).then_some(())
    })
    .await;
    assert_eq!(live_pods(&pods).await.len(), 3, "the released pod stays");

    task.abort();
    cluster.stop().await;
}

both!(
    deletion_cascades_or_orphans,
    rs_deletion_cascades_or_orphans,
    rc_deletion_cascades_or_orphans
);
/// With every controller running (the garbage collector included): a foreground deletion
/// takes the pods first, an orphaning one leaves them without their owner.
async fn deletion_cascades_or_orphans<K: Kind>() {
    let (cluster, sets, pods) = setup_on::<K>(TestCluster::start_with_controllers().await).await;
    create_rs(&sets, 2).await;
    let first = wait_count(&pods, 2).await;
    sets.delete("web", &DeleteParams::foreground())
        .await
        .unwrap();
    eventually("the owner and its pods gone", || async {
        let owner = sets.get_opt("web").await.unwrap();
        let left = pods.list(&ListParams::default()).await.unwrap().items;
        (owner.is_none() && left.is_empty()).then_some(())
    })
    .await;
    assert!(first.iter().all(|p| p.metadata.owner_references.is_some()));

    create_rs(&sets, 2).await;
    wait_count(&pods, 2).await;
    let orphan = DeleteParams {
        propagation_policy: Some("Orphan".into()),
        ..Default::default()
    };
    sets.delete("web", &orphan).await.unwrap();
    let kept = eventually("the owner gone, its pods orphaned", || async {
        let owner = sets.get_opt("web").await.unwrap();
        let left = live_pods(&pods).await;
        (owner.is_none()
            && left.len() == 2
            && left.iter().all(|p| {
                p.metadata
                    .owner_references
                    .as_ref()
                    .is_none_or(|r| r.is_empty())
            }))
        .then_some(left)
    })
    .await;
    assert_eq!(kept.len(), 2);

    cluster.stop().await;
}

both!(
    a_restarted_controller_does_not_duplicate_pods,
    rs_a_restarted_controller_does_not_duplicate_pods,
    rc_a_restarted_controller_does_not_duplicate_pods
);
async fn a_restarted_controller_does_not_duplicate_pods<K: Kind>() {
    let (cluster, sets, pods) = setup::<K>().await;
    create_rs(&sets, 0).await;
    let first = start_controller::<K>(&gated_client(&cluster, 5));
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
    let _second = start_controller::<K>(&cluster.client());
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

both!(
    a_failing_create_is_reported_without_flooding,
    rs_a_failing_create_is_reported_without_flooding,
    rc_a_failing_create_is_reported_without_flooding
);
async fn a_failing_create_is_reported_without_flooding<K: Kind>() {
    let (cluster, sets, pods) = setup::<K>().await;
    let attempts = Arc::new(AtomicUsize::new(0));
    let router = setpoint_apiserver::http::router(cluster.server().clone());
    let client = Client::new(FailPodCreates(
        ServiceTransport::new(router),
        attempts.clone(),
    ));
    create_rs(&sets, 20).await;
    let task = start_controller::<K>(&client);

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
