//! The namespace controller and the garbage collector against a real in-process API server.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use serde_json::json;
use setpoint_runtime::client::{
    Api, Body, Client, ClientError, DeleteParams, Patch, PatchParams, PostParams, ServiceTransport,
    Transport,
};
use setpoint_runtime::informer::SharedInformers;
use setpoint_testing::TestCluster;

/// Starts both controllers on `cluster`; they stop when the returned tasks are aborted.
async fn start_controllers(client: &Client) -> Vec<tokio::task::JoinHandle<()>> {
    let informers = SharedInformers::new(client.clone());
    let resources = setpoint_controllers::gc::resources(client).await;
    let ns = setpoint_controllers::namespace::controller(client.clone(), &informers);
    let gc = setpoint_controllers::gc::controller(client.clone(), &informers, &resources);
    vec![
        tokio::spawn(ns.run(std::future::pending())),
        tokio::spawn(gc.run(std::future::pending())),
    ]
}

/// Polls `check` until it returns `Some`, or panics after 20 s.
async fn eventually<T, F: Future<Output = Option<T>>>(what: &str, check: impl FnMut() -> F) -> T {
    setpoint_testing::eventually_within(Duration::from_secs(20), what, check).await
}

async fn config_map(api: &Api<ConfigMap>, body: serde_json::Value) -> ConfigMap {
    let cm: ConfigMap = serde_json::from_value(body).unwrap();
    api.create(&PostParams::default(), &cm).await.unwrap()
}

/// Waits until the garbage collector has caught up with everything before this call: it
/// creates a ConfigMap whose owner never existed and waits for the collector to delete it.
/// (One work queue serves every object, in order, so earlier events were handled first.)
async fn gc_barrier(api: &Api<ConfigMap>, name: &str) {
    config_map(
        api,
        json!({"metadata": {"name": name, "ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "nobody", "uid": "no-such-uid"}
        ]}}),
    )
    .await;
    eventually("the garbage collector to catch up", || gone(api, name)).await;
}

/// An owner ConfigMap `owner` and dependents `dep-1`, `dep-2` (`dep-2` held by a finalizer
/// when `hold` is set) in `namespace`.
async fn family(api: &Api<ConfigMap>, hold: bool) -> ConfigMap {
    let owner = config_map(api, json!({"metadata": {"name": "owner"}})).await;
    let reference = json!([{
        "apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
        "uid": owner.metadata.uid.clone().unwrap(), "blockOwnerDeletion": true
    }]);
    config_map(
        api,
        json!({"metadata": {"name": "dep-1", "ownerReferences": reference}}),
    )
    .await;
    let finalizers = if hold {
        json!(["example.com/hold"])
    } else {
        json!([])
    };
    config_map(
        api,
        json!({"metadata": {"name": "dep-2", "ownerReferences": reference, "finalizers": finalizers}}),
    )
    .await;
    owner
}

async fn release(api: &Api<ConfigMap>, name: &str) {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
}

async fn gone(api: &Api<ConfigMap>, name: &str) -> Option<()> {
    api.get_opt(name).await.unwrap().is_none().then_some(())
}

#[tokio::test]
async fn namespace_is_emptied_and_then_removed() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let tasks = start_controllers(&client).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "demo"}})).unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "demo");
    for name in ["a", "b"] {
        config_map(&cms, json!({"metadata": {"name": name}})).await;
    }
    config_map(
        &cms,
        json!({"metadata": {"name": "held", "finalizers": ["example.com/hold"]}}),
    )
    .await;

    namespaces
        .delete("demo", &DeleteParams::default())
        .await
        .unwrap();
    eventually("plain content deleted", || async {
        let (a, b) = (gone(&cms, "a").await, gone(&cms, "b").await);
        a.and(b)
    })
    .await;
    // The held object blocks the namespace, and the conditions say why.
    let ns = eventually("finalizer condition", || async {
        let ns = namespaces.get("demo").await.unwrap();
        let conditions = ns.status.as_ref()?.conditions.clone()?;
        conditions
            .iter()
            .any(|c| {
                c.type_ == setpoint_controllers::namespace::FINALIZERS_REMAINING
                    && c.status == "True"
            })
            .then_some(ns)
    })
    .await;
    assert_eq!(
        ns.status.unwrap().phase.as_deref(),
        Some("Terminating"),
        "the namespace is terminating"
    );
    let held = cms.get("held").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());

    release(&cms, "held").await;
    eventually("namespace removed", || async {
        namespaces
            .get_opt("demo")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    tasks.iter().for_each(|t| t.abort());
}

#[tokio::test]
async fn background_deletion_removes_dependents() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let tasks = start_controllers(&client).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    family(&cms, false).await;
    // A dependent that also has a living owner keeps existing, minus the dangling reference.
    let other = config_map(&cms, json!({"metadata": {"name": "other"}})).await;
    let owner = cms.get("owner").await.unwrap();
    config_map(
        &cms,
        json!({"metadata": {"name": "shared", "ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid},
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "other", "uid": other.metadata.uid},
        ]}}),
    )
    .await;

    cms.delete("owner", &DeleteParams::default()).await.unwrap();
    eventually("dependents deleted", || async {
        gone(&cms, "dep-1").await.and(gone(&cms, "dep-2").await)
    })
    .await;
    eventually("dangling reference removed", || async {
        let shared = cms.get("shared").await.unwrap();
        let refs = shared.metadata.owner_references.unwrap_or_default();
        (refs.len() == 1 && refs[0].name == "other").then_some(())
    })
    .await;
    assert!(cms.get_opt("other").await.unwrap().is_some());
    tasks.iter().for_each(|t| t.abort());
}

#[tokio::test]
async fn foreground_deletion_keeps_the_owner_until_dependents_are_gone() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let tasks = start_controllers(&client).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    family(&cms, true).await;

    cms.delete("owner", &DeleteParams::foreground())
        .await
        .unwrap();
    eventually("unheld dependent deleted", || gone(&cms, "dep-1")).await;
    eventually("held dependent terminating", || async {
        cms.get("dep-2")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .map(|_| ())
    })
    .await;
    // A blocking dependent remains: the owner must still be there.
    gc_barrier(&cms, "barrier").await;
    let owner = cms.get("owner").await.unwrap();
    assert!(owner.metadata.deletion_timestamp.is_some());
    assert!(owner
        .metadata
        .finalizers
        .unwrap_or_default()
        .contains(&"foregroundDeletion".to_string()));

    release(&cms, "dep-2").await;
    eventually("owner deleted", || gone(&cms, "owner")).await;
    tasks.iter().for_each(|t| t.abort());
}

#[tokio::test]
async fn orphan_deletion_keeps_dependents_without_references() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let tasks = start_controllers(&client).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    family(&cms, false).await;

    let orphan = DeleteParams {
        propagation_policy: Some("Orphan".into()),
        ..Default::default()
    };
    cms.delete("owner", &orphan).await.unwrap();
    eventually("owner deleted", || gone(&cms, "owner")).await;
    // A wrongly triggered background collection would have happened by now.
    gc_barrier(&cms, "barrier").await;
    for name in ["dep-1", "dep-2"] {
        let dep = cms.get(name).await.unwrap();
        assert_eq!(
            dep.metadata.owner_references, None,
            "{name} keeps no reference to the deleted owner"
        );
    }
    tasks.iter().for_each(|t| t.abort());
}

#[tokio::test]
async fn owners_of_other_kinds_and_stale_uids_are_resolved() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let tasks = start_controllers(&client).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    // A cluster-scoped owner: a namespace owning a ConfigMap elsewhere.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "team"}})).unwrap();
    let ns = namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    config_map(
        &cms,
        json!({"metadata": {"name": "team-settings", "ownerReferences": [
            {"apiVersion": "v1", "kind": "Namespace", "name": "team", "uid": ns.metadata.uid}
        ]}}),
    )
    .await;
    // A reference to an owner with the right name but another uid (an earlier incarnation).
    config_map(&cms, json!({"metadata": {"name": "current"}})).await;
    config_map(
        &cms,
        json!({"metadata": {"name": "stale", "ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "current", "uid": "not-the-uid"}
        ]}}),
    )
    .await;
    eventually("stale dependent deleted", || gone(&cms, "stale")).await;
    gc_barrier(&cms, "barrier").await;
    assert!(cms.get_opt("team-settings").await.unwrap().is_some());

    namespaces
        .delete("team", &DeleteParams::default())
        .await
        .unwrap();
    eventually("dependent of the namespace deleted", || {
        gone(&cms, "team-settings")
    })
    .await;
    tasks.iter().for_each(|t| t.abort());
}

/// Forwards every request to the server, but right before the first DELETE of `target` it
/// changes `target` (a label, nothing the collector reads), so that the delete, preconditioned
/// on the version the collector judged, is refused with a real 409.
struct RacingWrite<T> {
    inner: T,
    target: String,
    raced: AtomicBool,
    refused: AtomicBool,
}

#[async_trait::async_trait]
impl<T: Transport> Transport for RacingWrite<T> {
    async fn send(&self, req: http::Request<Bytes>) -> Result<http::Response<Body>, ClientError> {
        let path = req.uri().path().to_string();
        let first_delete = req.method() == http::Method::DELETE
            && path.ends_with(&self.target)
            && !self.raced.swap(true, Ordering::SeqCst);
        if first_delete {
            let label = http::Request::patch(path.as_str())
                .header("content-type", "application/merge-patch+json")
                .body(Bytes::from_static(
                    br#"{"metadata":{"labels":{"raced":"yes"}}}"#,
                ))
                .unwrap();
            let resp = self.inner.send(label).await?;
            assert!(resp.status().is_success(), "{}", resp.status());
        }
        let resp = self.inner.send(req).await?;
        if first_delete && resp.status() == http::StatusCode::CONFLICT {
            self.refused.store(true, Ordering::SeqCst);
        }
        Ok(resp)
    }
}

#[tokio::test]
async fn a_write_refused_as_stale_is_judged_again_without_another_event() {
    let cluster = TestCluster::start().await;
    let racing = Arc::new(RacingWrite {
        inner: ServiceTransport::new(setpoint_apiserver::http::router(cluster.server().clone())),
        target: "/configmaps/orphan".into(),
        raced: AtomicBool::new(false),
        refused: AtomicBool::new(false),
    });
    let gc_client = Client::new(SharedTransport(racing.clone()));
    let informers = SharedInformers::new(cluster.client());
    let resources = setpoint_controllers::gc::resources(&cluster.client()).await;
    let gc = setpoint_controllers::gc::controller(gc_client, &informers, &resources);
    let task = tokio::spawn(gc.run(std::future::pending()));

    let cms: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    config_map(
        &cms,
        json!({"metadata": {"name": "orphan", "ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "gone", "uid": "no-such-uid"}
        ]}}),
    )
    .await;
    // The label change is the only event after the refusal, and it concerns nothing the
    // collector acts on: the collector must come back on its own.
    eventually("the orphan deleted after its delete was refused", || {
        gone(&cms, "orphan")
    })
    .await;
    assert!(
        racing.refused.load(Ordering::SeqCst),
        "the race did not happen"
    );
    task.abort();
}

/// A transport shared with the test, which reads its flags.
struct SharedTransport<T>(Arc<T>);

#[async_trait::async_trait]
impl<T: Transport> Transport for SharedTransport<T> {
    async fn send(&self, req: http::Request<Bytes>) -> Result<http::Response<Body>, ClientError> {
        self.0.send(req).await
    }
}
