//! The Deployment controller against a real in-process API server.
//!
//! No kubelet runs here, so the test stands in for the ReplicaSet controller and ready pods:
//! it keeps every ReplicaSet's `status` at its `spec.replicas` through the status
//! subresource, which is what the ReplicaSet controller reports once those pods are ready.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use setpoint_controllers::deployment::{self, HASH_LABEL, REVISION};
use setpoint_controllers::replicaset;
use setpoint_runtime::client::{Api, Client, ListParams, Patch, PatchParams, PostParams};
use setpoint_runtime::informer::{Event, Scope, SharedInformers};
use setpoint_testing::TestCluster;

/// Polls `check` until it returns `Some`, or panics after 20 s.
async fn eventually<T, F: Future<Output = Option<T>>>(what: &str, check: impl FnMut() -> F) -> T {
    setpoint_testing::eventually_within(Duration::from_secs(20), what, check).await
}

/// Calls `step` with every cached object of `K` in `default` once the cache has synced and
/// again after each change: a stand-in component that reacts to events, as the real ones do.
async fn on_changes<K, F>(client: Client, mut step: impl FnMut(Api<K>, Vec<Arc<K>>) -> F)
where
    K: k8s_openapi::Resource + setpoint_runtime::Object,
    K::Scope: 'static,
    F: Future<Output = ()>,
{
    let informers = SharedInformers::new(client.clone());
    let informer = informers.typed::<K>(Scope::namespace("default"));
    let changed = Arc::new(tokio::sync::Notify::new());
    let notify = changed.clone();
    let _subscription = informer.subscribe(Arc::new(move |_: &Event<K>| notify.notify_one()));
    let api: Api<K> = Api::namespaced(client, "default");
    let _ = informer.wait_synced().await;
    loop {
        step(api.clone(), informer.store().list()).await;
        changed.notified().await;
    }
}

/// Plays the ReplicaSet controller with instantly ready pods.
async fn simulate_pods(client: Client) {
    on_changes(client, |api: Api<ReplicaSet>, sets| async move {
        for rs in sets {
            let want = rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
            let st = rs.status.clone().unwrap_or_default();
            if st.replicas != want || st.available_replicas.unwrap_or(0) != want {
                let _ = api
                    .patch_status(
                        rs.metadata.name.as_deref().unwrap(),
                        &PatchParams::default(),
                        &Patch::Merge(json!({"status": {
                            "replicas": want,
                            "fullyLabeledReplicas": want,
                            "readyReplicas": want,
                            "availableReplicas": want,
                            "observedGeneration": rs.metadata.generation,
                        }})),
                    )
                    .await;
            }
        }
    })
    .await
}

async fn replica_sets(api: &Api<ReplicaSet>) -> Vec<ReplicaSet> {
    api.list(&ListParams::default()).await.unwrap().items
}

fn revision(rs: &ReplicaSet) -> &str {
    rs.metadata.annotations.as_ref().unwrap()[REVISION].as_str()
}

fn replicas(rs: &ReplicaSet) -> i32 {
    rs.spec.as_ref().unwrap().replicas.unwrap()
}

fn image(rs: &ReplicaSet) -> String {
    rs.spec
        .as_ref()
        .unwrap()
        .template
        .as_ref()
        .unwrap()
        .spec
        .as_ref()
        .unwrap()
        .containers[0]
        .image
        .clone()
        .unwrap()
}

/// The deployment once `kubectl rollout status` would call it rolled out.
async fn rolled_out(api: &Api<Deployment>) -> Deployment {
    eventually("the rollout to complete", || async {
        let d = api.get("app").await.unwrap();
        let st = d.status.clone()?;
        let cond = |t: &str| {
            st.conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == t)
                .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()))
        };
        let want = d.spec.as_ref()?.replicas?;
        (d.metadata.generation == st.observed_generation
            && st.updated_replicas == Some(want)
            && st.replicas == Some(want)
            && st.available_replicas == Some(want)
            && cond("Available") == Some(("True".into(), "MinimumReplicasAvailable".into()))
            && cond("Progressing") == Some(("True".into(), "NewReplicaSetAvailable".into())))
        .then_some(d)
    })
    .await
}

/// Stands in for the kubelet: every pod runs and is Ready as soon as it exists.
async fn simulate_kubelet(client: Client) {
    on_changes(client, |api: Api<Pod>, pods| async move {
        for pod in pods {
            let ready = pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            if !ready && pod.metadata.deletion_timestamp.is_none() {
                let _ = api
                    .patch_status(
                        pod.metadata.name.as_deref().unwrap(),
                        &PatchParams::default(),
                        &Patch::Merge(json!({"status": {
                            "phase": "Running",
                            "conditions": [{"type": "Ready", "status": "True",
                                            "lastTransitionTime": "2020-01-01T00:00:00Z"}],
                        }})),
                    )
                    .await;
            }
        }
    })
    .await
}

#[tokio::test]
async fn rolling_update_pause_and_rollback() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let informers = SharedInformers::new(client.clone());
    let controller = deployment::controller(client.clone(), &informers);
    let tasks = vec![
        tokio::spawn(controller.run(std::future::pending())),
        tokio::spawn(simulate_pods(client.clone())),
    ];
    scenario(&client).await;
    for t in tasks {
        t.abort();
    }
    cluster.stop().await;
}

/// The same, with the real ReplicaSet controller making the pods.
#[tokio::test]
async fn rolling_update_with_the_replicaset_controller() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let informers = SharedInformers::new(client.clone());
    let deployments = deployment::controller(client.clone(), &informers);
    let replica_sets = replicaset::controller(client.clone(), &informers);
    let tasks = vec![
        tokio::spawn(deployments.run(std::future::pending())),
        tokio::spawn(replica_sets.run(std::future::pending())),
        tokio::spawn(simulate_kubelet(client.clone())),
    ];
    scenario(&client).await;
    for t in tasks {
        t.abort();
    }
    cluster.stop().await;
}

/// Create, roll out a new image, pause, resume and roll back.
async fn scenario(client: &Client) {
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let rses: Api<ReplicaSet> = Api::namespaced(client.clone(), "default");

    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "app"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "app"}},
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": {"app": "app"}},
                "spec": {"containers": [{"name": "web", "image": "nginx:1"}]}
            }
        }
    }))
    .unwrap();
    let d = deploys.create(&PostParams::default(), &d).await.unwrap();

    // One ReplicaSet with 3 replicas, named after its template hash and owned by the deployment.
    let first = eventually("the first replica set", || async {
        let all = replica_sets(&rses).await;
        (all.len() == 1 && replicas(&all[0]) == 3).then(|| all[0].clone())
    })
    .await;
    let hash = first.metadata.labels.as_ref().unwrap()[HASH_LABEL].clone();
    assert_eq!(
        first.metadata.name.as_deref(),
        Some(format!("app-{hash}").as_str())
    );
    let owner = &first.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(owner.uid, d.metadata.uid.clone().unwrap());
    assert_eq!(owner.controller, Some(true));
    assert_eq!(revision(&first), "1");
    rolled_out(&deploys).await;

    // A new image (strategic merge patch, as `kubectl set image` sends).
    deploys
        .patch(
            "app",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"template": {"spec": {
                "containers": [{"name": "web", "image": "nginx:2"}]}}}})),
        )
        .await
        .unwrap();
    let d = rolled_out(&deploys).await;
    assert_eq!(d.metadata.annotations.as_ref().unwrap()[REVISION], "2");
    let all = replica_sets(&rses).await;
    assert_eq!(all.len(), 2);
    let old = all.iter().find(|r| revision(r) == "1").unwrap();
    let new = all.iter().find(|r| revision(r) == "2").unwrap();
    assert_eq!((replicas(old), replicas(new)), (0, 3));
    assert_eq!(image(new), "nginx:2");

    // Paused: a template change makes no progress.
    let pause = |paused: serde_json::Value| {
        let deploys = deploys.clone();
        async move {
            deploys
                .patch(
                    "app",
                    &PatchParams::default(),
                    &Patch::Strategic(json!({"spec": {"paused": paused}})),
                )
                .await
                .unwrap();
        }
    };
    pause(json!(true)).await;
    deploys
        .patch(
            "app",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"template": {"spec": {
                "containers": [{"name": "web", "image": "nginx:3"}]}}}})),
        )
        .await
        .unwrap();
    eventually("the paused condition", || async {
        let d = deploys.get("app").await.unwrap();
        let st = d.status?;
        (st.observed_generation == d.metadata.generation
            && st.conditions.iter().flatten().any(|c| {
                c.type_ == "Progressing" && c.reason.as_deref() == Some("DeploymentPaused")
            }))
        .then_some(())
    })
    .await;
    // The status above was written at the end of the reconcile that saw the paused template:
    // any ReplicaSet that pass created is already there.
    assert_eq!(
        replica_sets(&rses).await.len(),
        2,
        "no rollout while paused"
    );
    // Back to the running template, then resume: nothing new to roll out.
    deploys
        .patch(
            "app",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"template": {"spec": {
                "containers": [{"name": "web", "image": "nginx:2"}]}}}})),
        )
        .await
        .unwrap();
    pause(serde_json::Value::Null).await;
    rolled_out(&deploys).await;
    assert_eq!(replica_sets(&rses).await.len(), 2);

    // `kubectl rollout undo`: the revision-1 template back, by JSON patch.
    let mut template = serde_json::to_value(old.spec.as_ref().unwrap().template.clone()).unwrap();
    template["metadata"]["labels"]
        .as_object_mut()
        .unwrap()
        .remove(HASH_LABEL);
    let d = deploys.get("app").await.unwrap();
    deploys
        .patch(
            "app",
            &PatchParams::default(),
            &Patch::Json(json!([
                {"op": "replace", "path": "/spec/template", "value": template},
                {"op": "replace", "path": "/metadata/annotations",
                 "value": d.metadata.annotations.clone().unwrap()},
            ])),
        )
        .await
        .unwrap();
    let d = eventually("the rollback", || async {
        let d = rolled_out(&deploys).await;
        (d.metadata.annotations.as_ref()?.get(REVISION)? == "3").then_some(d)
    })
    .await;
    let all = replica_sets(&rses).await;
    assert_eq!(all.len(), 2, "the old replica set is reused");
    let back = all
        .iter()
        .find(|r| r.metadata.name == old.metadata.name)
        .unwrap();
    assert_eq!(revision(back), "3");
    assert_eq!(replicas(back), 3);
    assert_eq!(image(back), "nginx:1");
    let other = all
        .iter()
        .find(|r| r.metadata.name == new.metadata.name)
        .unwrap();
    assert_eq!(replicas(other), 0);
    assert_eq!(d.status.unwrap().observed_generation, d.metadata.generation);
}
