//! The controller against a real in-process API server: events become reconciles, errors and
//! panics are retried with backoff while other keys keep flowing, owned objects wake their
//! owner, and a controller without leadership does not reconcile.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use parking_lot::Mutex;
use serde_json::json;
use setpoint_runtime::client::{Api, PostParams};
use setpoint_runtime::controller::{Action, Context, Controller, ReconcileError, Reconciler};
use setpoint_runtime::informer::SharedInformers;
use setpoint_runtime::workqueue::WorkQueue;
use setpoint_runtime::ObjectKey;
use setpoint_testing::TestCluster;
use tokio::sync::Notify;

/// Records every reconcile; fails or panics for chosen names a set number of times.
#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<(String, u32)>>,
    fail: Mutex<HashMap<String, usize>>,
    panic: Mutex<HashMap<String, usize>>,
    /// Names whose reconciles never finish (until cancelled).
    hang: Mutex<Vec<String>>,
    /// The keys `interrupted` was called with.
    interrupted: Mutex<Vec<String>>,
    changed: Notify,
}

impl Recorder {
    fn count(&self, name: &str) -> usize {
        self.calls.lock().iter().filter(|(n, _)| n == name).count()
    }
    fn interruptions(&self, name: &str) -> usize {
        self.interrupted
            .lock()
            .iter()
            .filter(|n| *n == name)
            .count()
    }
    async fn wait_until(&self, what: &str, cond: impl Fn(&Recorder) -> bool) {
        let r = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let notified = self.changed.notified();
                if cond(self) {
                    return;
                }
                notified.await;
            }
        })
        .await;
        assert!(
            r.is_ok(),
            "timed out waiting for {what}; calls: {:?}; interrupted: {:?}",
            self.calls.lock(),
            self.interrupted.lock()
        );
    }
}

#[async_trait::async_trait]
impl Reconciler for Recorder {
    async fn reconcile(&self, ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        self.calls.lock().push((key.name.clone(), ctx.retries));
        self.changed.notify_waiters();
        let should_panic = {
            let mut p = self.panic.lock();
            match p.get_mut(&key.name) {
                Some(n) if *n > 0 => {
                    *n -= 1;
                    true
                }
                _ => false,
            }
        };
        if should_panic {
            panic!("boom for {key}");
        }
        if self.hang.lock().contains(&key.name) {
            std::future::pending::<()>().await;
        }
        let mut f = self.fail.lock();
        if let Some(n) = f.get_mut(&key.name) {
            if *n > 0 {
                *n -= 1;
                return Err(ReconcileError::retry(format!("failing {key}")));
            }
        }
        Ok(Action::Done)
    }

    fn interrupted(&self, key: &ObjectKey) {
        self.interrupted.lock().push(key.name.clone());
        self.changed.notify_waiters();
    }
}

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default"}})).unwrap()
}

fn fast_queue(name: &str) -> setpoint_runtime::workqueue::WorkQueueBuilder<ObjectKey> {
    WorkQueue::<ObjectKey>::builder(name)
        .backoff(Duration::from_millis(5), Duration::from_millis(200))
        .no_rate_limit()
}

async fn errors_and_panics_are_retried_while_other_keys_flow(cluster: TestCluster) {
    let informers = SharedInformers::new(cluster.client());
    let rec = Arc::new(Recorder::default());
    rec.fail.lock().insert("flaky".into(), 3);
    rec.panic.lock().insert("bomb".into(), 2);
    let controller = Controller::for_type::<ConfigMap>("recorder", &informers, None)
        .queue(fast_queue("recorder"))
        .workers(2)
        .build(rec.clone());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(controller.run(async move {
        let _ = stop_rx.await;
    }));
    let api: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    for n in ["flaky", "bomb", "fine"] {
        api.create(&PostParams::default(), &cm(n)).await.unwrap();
    }
    rec.wait_until("retries to succeed", |r| {
        r.count("flaky") >= 4 && r.count("bomb") >= 3 && r.count("fine") >= 1
    })
    .await;
    // The retry counter grew with each failure and reset after success.
    let flaky: Vec<u32> = rec
        .calls
        .lock()
        .iter()
        .filter(|(n, _)| n == "flaky")
        .map(|(_, r)| *r)
        .collect();
    assert_eq!(&flaky[..4], &[0, 1, 2, 3], "{flaky:?}");
    // A panicking reconcile was interrupted (its writes may or may not have happened); one
    // that returned an error was not.
    assert_eq!(rec.interruptions("bomb"), 2);
    assert_eq!(rec.interruptions("flaky"), 0);
    // The controller still serves new keys after the panics.
    api.create(&PostParams::default(), &cm("later"))
        .await
        .unwrap();
    rec.wait_until("a later key", |r| r.count("later") >= 1)
        .await;
    let _ = stop_tx.send(());
    run.await.unwrap();
}

async fn owned_objects_wake_their_controlling_owner(cluster: TestCluster) {
    let informers = SharedInformers::new(cluster.client());
    let rec = Arc::new(Recorder::default());
    let controller = Controller::for_type::<ReplicaSet>("rs", &informers, None)
        .owns::<ReplicaSet, Pod>(None)
        .queue(fast_queue("rs"))
        .build(rec.clone());
    let run = tokio::spawn(controller.run(std::future::pending()));
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let mut pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p1", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]}
    }))
    .unwrap();
    pod.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "apps/v1".into(),
        kind: "ReplicaSet".into(),
        name: "owner-rs".into(),
        uid: "u-1".into(),
        controller: Some(true),
        ..Default::default()
    }]);
    pods.create(&PostParams::default(), &pod).await.unwrap();
    rec.wait_until("the owner to be reconciled", |r| r.count("owner-rs") >= 1)
        .await;
    assert_eq!(rec.count("p1"), 0, "pods are not reconciled by themselves");
    run.abort();
}

async fn without_leadership_nothing_is_reconciled(cluster: TestCluster) {
    let informers = SharedInformers::new(cluster.client());
    let rec = Arc::new(Recorder::default());
    let (lead_tx, lead_rx) = tokio::sync::watch::channel(false);
    let controller = Controller::for_type::<ConfigMap>("gated", &informers, None)
        .queue(fast_queue("gated"))
        .build(rec.clone())
        .with_leadership(lead_rx);
    let run = tokio::spawn(controller.run(std::future::pending()));
    let api: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    api.create(&PostParams::default(), &cm("waiting"))
        .await
        .unwrap();
    // The informer has seen it (caches stay warm on a standby) ...
    let inf = informers.typed::<ConfigMap>(setpoint_runtime::informer::Scope::all());
    tokio::time::timeout(Duration::from_secs(10), async {
        while inf
            .store()
            .get(&ObjectKey::new(Some("default"), "waiting"))
            .is_none()
        {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap();
    // ... but no reconcile runs until leadership arrives.
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert_eq!(rec.count("waiting"), 0);
    lead_tx.send(true).unwrap();
    rec.wait_until("reconcile after leadership", |r| r.count("waiting") >= 1)
        .await;
    assert_eq!(rec.interruptions("waiting"), 0);
    // Losing leadership cancels a reconcile in flight, and the reconciler hears of it.
    rec.hang.lock().push("stuck".into());
    api.create(&PostParams::default(), &cm("stuck"))
        .await
        .unwrap();
    rec.wait_until("a reconcile that never ends", |r| r.count("stuck") >= 1)
        .await;
    lead_tx.send(false).unwrap();
    rec.wait_until("the cancelled reconcile interrupted", |r| {
        r.interruptions("stuck") == 1
    })
    .await;
    run.abort();
}

async fn reconciles_are_counted_in_metrics(cluster: TestCluster) {
    let informers = SharedInformers::new(cluster.client());
    let rec = Arc::new(Recorder::default());
    rec.fail.lock().insert("m1".into(), 1);
    let metrics = setpoint_runtime::controller::ControllerMetrics::new();
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let controller = Controller::for_type::<ConfigMap>("metered", &informers, None)
        .queue(fast_queue("metered"))
        .metrics(metrics)
        .build(rec.clone());
    let run = tokio::spawn(controller.run(std::future::pending()));
    let api: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    api.create(&PostParams::default(), &cm("m1")).await.unwrap();
    rec.wait_until("retry", |r| r.count("m1") >= 2).await;
    let done = Arc::new(AtomicUsize::new(0));
    let d = done.clone();
    tokio::time::timeout(Duration::from_secs(10), async move {
        loop {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
            if text.contains(
                "controller_runtime_reconcile_total{controller=\"metered\",result=\"success\"}",
            ) && text
                .contains("controller_runtime_reconcile_errors_total{controller=\"metered\"} 1")
                && text.contains("workqueue_adds_total")
            {
                d.store(1, Ordering::SeqCst);
                return;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap();
    assert_eq!(done.load(Ordering::SeqCst), 1);
    run.abort();
}

#[tokio::test]
async fn errors_and_panics_are_retried_while_other_keys_flow_in_process() {
    errors_and_panics_are_retried_while_other_keys_flow(TestCluster::start().await).await;
}

#[tokio::test]
async fn errors_and_panics_are_retried_while_other_keys_flow_over_https() {
    errors_and_panics_are_retried_while_other_keys_flow(TestCluster::start_https().await).await;
}

#[tokio::test]
async fn owned_objects_wake_their_controlling_owner_in_process() {
    owned_objects_wake_their_controlling_owner(TestCluster::start().await).await;
}

#[tokio::test]
async fn owned_objects_wake_their_controlling_owner_over_https() {
    owned_objects_wake_their_controlling_owner(TestCluster::start_https().await).await;
}

#[tokio::test]
async fn without_leadership_nothing_is_reconciled_in_process() {
    without_leadership_nothing_is_reconciled(TestCluster::start().await).await;
}

#[tokio::test]
async fn without_leadership_nothing_is_reconciled_over_https() {
    without_leadership_nothing_is_reconciled(TestCluster::start_https().await).await;
}

#[tokio::test]
async fn reconciles_are_counted_in_metrics_in_process() {
    reconciles_are_counted_in_metrics(TestCluster::start().await).await;
}

#[tokio::test]
async fn reconciles_are_counted_in_metrics_over_https() {
    reconciles_are_counted_in_metrics(TestCluster::start_https().await).await;
}
