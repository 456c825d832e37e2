//! The namespace controller and the garbage collector against a real in-process API server.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use serde_json::json;
use setpoint_runtime::client::{Api, Client, DeleteParams, Patch, PatchParams, PostParams};
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
