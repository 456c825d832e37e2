//! The namespace controller and the garbage collector against a real in-process API server.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolume, PersistentVolumeClaim};
use serde_json::json;
use setpoint_runtime::client::{
    Api, Body, Client, ClientError, DeleteParams, Patch, PatchParams, PostParams, ServiceTransport,
    Transport,
};
use setpoint_runtime::decision::{self, ActionRecord, DecisionRecord};
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

/// The newest finished decision record of `controller` about `name` with an action whose
/// description starts with `action`, and that action.
fn decided(
    controller: &str,
    name: &str,
    action: &str,
) -> Option<(Arc<DecisionRecord>, ActionRecord)> {
    decision::ring()
        .about(controller, name)
        .into_iter()
        .rev()
        .find_map(|r| {
            let a = r
                .actions
                .iter()
                .find(|a| a.action.starts_with(action))?
                .clone();
            Some((r, a))
        })
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

    // The decision that deleted the content says what remained and why it went.
    let ns_controller = setpoint_controllers::namespace::NAME;
    let (record, action) = eventually("the record deleting the content", || async {
        decided(ns_controller, "demo", "delete 3 configmaps: a, b, held")
    })
    .await;
    assert_eq!(
        action.rule,
        "the namespace is terminating and they are not being deleted yet"
    );
    assert!(
        record
            .observed
            .iter()
            .any(|o| o == "remaining: configmaps 3; their finalizers: example.com/hold on 1"),
        "{record:?}"
    );

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
    let (record, action) = eventually("the record finalizing the namespace", || async {
        decided(
            ns_controller,
            "demo",
            "remove finalizer kubernetes (finalize)",
        )
    })
    .await;
    assert_eq!(
        action.rule,
        "nothing remains in the namespace (fresh discovery, no failures)"
    );
    assert!(
        record
            .observed
            .iter()
            .any(|o| o == "nothing remains in the namespace"),
        "{record:?}"
    );
    tasks.iter().for_each(|t| t.abort());
}

/// The PersistentVolume binder (both sides) and the two protection controllers record what
/// they saw and why they acted: a static volume bound to a claim, released once the claim is
/// deleted (its protection finalizer removed first), and its own finalizer removed when it
/// is deleted.
#[tokio::test]
async fn storage_controllers_record_their_decisions() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let informers = SharedInformers::new(client.clone());
    let mut controllers =
        setpoint_controllers::persistentvolume::controllers(client.clone(), &informers);
    controllers.push(setpoint_controllers::volumeprotection::claim_controller(
        client.clone(),
        &informers,
    ));
    controllers.push(setpoint_controllers::volumeprotection::volume_controller(
        client.clone(),
        &informers,
    ));
    let tasks: Vec<_> = controllers
        .into_iter()
        .map(|c| tokio::spawn(c.run(std::future::pending())))
        .collect();

    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "record-pv"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                 "hostPath": {"path": "/tmp/record-pv"}}
    }))
    .unwrap();
    pvs.create(&PostParams::default(), &pv).await.unwrap();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "record-data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                 "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap();
    claims.create(&PostParams::default(), &pvc).await.unwrap();

    let binder = setpoint_controllers::persistentvolume::NAME;
    let (record, action) = eventually("the binding decision", || async {
        decided(binder, "record-data", "bind volume record-pv to the claim")
    })
    .await;
    assert!(
        action
            .rule
            .starts_with("the smallest free volume that satisfies"),
        "{action:?}"
    );
    assert!(
        record.observed[0].starts_with("phase Pending, no class, requests 1Gi [ReadWriteOnce]"),
        "{record:?}"
    );

    claims
        .delete("record-data", &DeleteParams::default())
        .await
        .unwrap();
    let (record, action) = eventually("the claim's protection released", || async {
        decided(
            setpoint_controllers::volumeprotection::PVC_NAME,
            "record-data",
            "remove finalizer kubernetes.io/pvc-protection",
        )
    })
    .await;
    assert_eq!(
        action.rule,
        "the claim is being deleted and no pod that has not finished uses it"
    );
    assert!(!record.observed.is_empty());
    let volumes = format!("{binder}-volumes");
    let (record, action) = eventually("the volume released", || async {
        decided(&volumes, "record-pv", "set phase Released")
    })
    .await;
    assert_eq!(action.rule, "its claim default/record-data is gone");
    assert!(
        record.observed[0].starts_with("phase Bound, reclaim policy Retain"),
        "{record:?}"
    );

    pvs.delete("record-pv", &DeleteParams::default())
        .await
        .unwrap();
    let (_, action) = eventually("the volume's protection released", || async {
        decided(
            setpoint_controllers::volumeprotection::PV_NAME,
            "record-pv",
            "remove finalizer kubernetes.io/pv-protection",
        )
    })
    .await;
    assert_eq!(
        action.rule,
        "the volume is being deleted and not Bound (phase Released)"
    );
    tasks.iter().for_each(|t| t.abort());
    informers.shutdown().await;
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

/// Creates `object` (JSON) through `api`.
async fn create<K: setpoint_runtime::Object>(api: &Api<K>, object: serde_json::Value) -> K {
    let object: K = serde_json::from_value(object).unwrap();
    api.create(&PostParams::default(), &object).await.unwrap()
}

#[tokio::test]
async fn the_disruption_controller_records_its_counts_and_status_writes() {
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let informers = SharedInformers::new(client.clone());
    let ctrl = setpoint_controllers::disruption::controller(client.clone(), &informers);
    let task = tokio::spawn(ctrl.run(std::future::pending()));
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "default");
    create(
        &pdbs,
        json!({"metadata": {"name": "db"},
               "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}}}),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for name in ["db-0", "db-1"] {
        let mut pod = create(
            &pods,
            json!({"metadata": {"name": name, "labels": {"app": "db"}},
                   "spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
        )
        .await;
        pod.status = Some(
            serde_json::from_value(json!({"phase": "Running",
                "conditions": [{"type": "Ready", "status": "True"}]}))
            .unwrap(),
        );
        pods.replace_status(name, &PostParams::default(), &pod)
            .await
            .unwrap();
    }
    let (_, rule) = setpoint_testing::decision(
        "disruption",
        "default",
        "db",
        "2 pods selected, 2 expected, 2 healthy, 1 desired healthy, 1 disruptions allowed",
        "update status",
    )
    .await;
    assert!(
        rule.starts_with("disruptionsAllowed changed: 0 -> 1"),
        "{rule}"
    );
    task.abort();
    cluster.stop().await;
}

#[tokio::test]
async fn the_resourcequota_controller_records_usage_and_status_writes() {
    use k8s_openapi::api::core::v1::ResourceQuota;
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let informers = SharedInformers::new(client.clone());
    let ctrl = setpoint_controllers::resourcequota::controller(client.clone(), &informers);
    let task = tokio::spawn(ctrl.run(std::future::pending()));
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), "default");
    create(
        &quotas,
        json!({"metadata": {"name": "small"}, "spec": {"hard": {"pods": "10"}}}),
    )
    .await;
    let (_, rule) = setpoint_testing::decision(
        "resourcequota",
        "default",
        "small",
        "used/hard: pods 0/10",
        "update status",
    )
    .await;
    assert!(
        rule.starts_with("the recount differs from the status: hard pods none -> 10"),
        "{rule}"
    );
    task.abort();
    cluster.stop().await;
}

#[tokio::test]
async fn the_service_lb_controller_records_nodes_and_ingress_writes() {
    use k8s_openapi::api::core::v1::{Node, Service};
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let mut node = create(&nodes, json!({"metadata": {"name": "lb-0"}})).await;
    node.status = Some(
        serde_json::from_value(json!({
            "conditions": [{"type": "Ready", "status": "True"}],
            "addresses": [{"type": "InternalIP", "address": "192.0.2.7"}]
        }))
        .unwrap(),
    );
    nodes
        .replace_status("lb-0", &PostParams::default(), &node)
        .await
        .unwrap();
    let informers = SharedInformers::new(client.clone());
    let ctrl = setpoint_controllers::servicelb::controller(client.clone(), &informers);
    let task = tokio::spawn(ctrl.run(std::future::pending()));
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    create(
        &services,
        json!({"metadata": {"name": "front"},
               "spec": {"type": "LoadBalancer", "selector": {"app": "front"},
                        "ports": [{"port": 80}]}}),
    )
    .await;
    let (_, rule) = setpoint_testing::decision(
        "service-lb-controller",
        "default",
        "front",
        "LoadBalancer: 1 nodes, 1 can serve; ingress none (want 192.0.2.7)",
        "patch status.loadBalancer.ingress to 192.0.2.7",
    )
    .await;
    assert!(
        rule.starts_with("the InternalIP of every Ready node"),
        "{rule}"
    );
    task.abort();
    cluster.stop().await;
}

#[tokio::test]
async fn the_hpa_controller_records_replicas_and_scale_writes() {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    create(
        &deployments,
        json!({"metadata": {"name": "web"},
               "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                        "template": {"metadata": {"labels": {"app": "web"}},
                                     "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}),
    )
    .await;
    let informers = SharedInformers::new(client.clone());
    let ctrl = setpoint_controllers::hpa::controller(
        client.clone(),
        &informers,
        setpoint_controllers::hpa::HpaConfig::default(),
    );
    let task = tokio::spawn(ctrl.run(std::future::pending()));
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), "default");
    create(
        &hpas,
        json!({"metadata": {"name": "web"},
               "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                        "minReplicas": 2, "maxReplicas": 5,
                        "metrics": [{"type": "Resource", "resource": {"name": "cpu",
                            "target": {"type": "Utilization", "averageUtilization": 50}}}]}}),
    )
    .await;
    let (observed, rule) = setpoint_testing::decision(
        "horizontalpodautoscaling",
        "default",
        "web",
        "Deployment/default/web: 1 replicas (spec)",
        "scale Deployment/default/web from 1 to 2",
    )
    .await;
    assert_eq!(rule, "1 current < minReplicas 2");
    assert!(
        observed
            .iter()
            .any(|o| o.contains("minReplicas 2, maxReplicas 5")),
        "{observed:?}"
    );
    let (_, rule) = setpoint_testing::decision(
        "horizontalpodautoscaling",
        "default",
        "web",
        "Deployment/default/web",
        "update status",
    )
    .await;
    assert!(rule.starts_with("the status differs: "), "{rule}");
    assert_eq!(
        deployments.get("web").await.unwrap().spec.unwrap().replicas,
        Some(2)
    );
    task.abort();
    cluster.stop().await;
}

/// The ServiceAccount, root CA publisher, token and ClusterRole aggregation controllers record
/// what they observed and the rule of each write; no record carries the CA or the token.
#[tokio::test]
async fn account_ca_token_and_aggregation_decisions_are_recorded() {
    use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
    use k8s_openapi::api::rbac::v1::ClusterRole;
    use setpoint_runtime::decision::DecisionRecord as Record;

    /// The finished records of `controller` about `name` that took an action.
    fn acted(controller: &str, name: &str) -> Option<Vec<Arc<Record>>> {
        let found: Vec<_> = setpoint_runtime::decision::ring()
            .about(controller, name)
            .into_iter()
            .filter(|r| !r.actions.is_empty())
            .collect();
        (!found.is_empty()).then_some(found)
    }
    const CA: &str = "-----BEGIN CERTIFICATE-----\nV0hZ\n-----END CERTIFICATE-----\n";
    let cluster =
        TestCluster::start_with_controller_options(setpoint_controllers::manager::Options {
            root_ca_pem: Some(CA.into()),
            ..Default::default()
        })
        .await;
    let client = cluster.client();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "why-accounts"}})).unwrap(),
        )
        .await
        .unwrap();
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "why-accounts");
    eventually("the default ServiceAccount", || async {
        accounts.get_opt("default").await.unwrap()
    })
    .await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "why-accounts");
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "bot-token",
                    "annotations": {"kubernetes.io/service-account.name": "default"}},
                "type": "kubernetes.io/service-account-token",
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let roles: Api<ClusterRole> = Api::all(client.clone());
    for role in [
        json!({"metadata": {"name": "why-agg-a", "labels": {"why-agg": "x"}},
            "rules": [{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}]}),
        json!({"metadata": {"name": "why-agg"}, "aggregationRule":
            {"clusterRoleSelectors": [{"matchLabels": {"why-agg": "x"}}]}}),
    ] {
        roles
            .create(
                &PostParams::default(),
                &serde_json::from_value(role).unwrap(),
            )
            .await
            .unwrap();
    }
    let token = eventually("the token", || async {
        let s = secrets.get("bot-token").await.unwrap();
        s.data?.get("token").map(|t| t.0.clone())
    })
    .await;
    let token = String::from_utf8(token).unwrap();

    let created = eventually("the ServiceAccount record", || async {
        acted(setpoint_controllers::serviceaccount::NAME, "why-accounts")
    })
    .await;
    let r = &created[0];
    assert_eq!(
        r.observed,
        ["namespace why-accounts active; no ServiceAccount default"],
        "{r:?}"
    );
    assert_eq!(r.actions[0].action, "create ServiceAccount default");
    assert_eq!(
        r.actions[0].rule,
        "namespace why-accounts is active and has none"
    );

    let published = eventually("the root CA record", || async {
        acted(setpoint_controllers::rootca::NAME, "why-accounts")
    })
    .await;
    let r = &published[0];
    assert_eq!(r.observed, ["no ConfigMap kube-root-ca.crt"], "{r:?}");
    assert_eq!(r.actions[0].action, "create ConfigMap kube-root-ca.crt");
    assert_eq!(
        r.actions[0].rule,
        "namespace why-accounts is active and has none"
    );

    let filled = eventually("the token record", || async {
        acted(setpoint_controllers::tokens::NAME, "bot-token")
    })
    .await;
    let r = &filled[0];
    assert!(
        r.observed
            .iter()
            .any(|o| o == "missing or stale: token, ca.crt, namespace, the uid annotation"),
        "{r:?}"
    );
    let actions: Vec<(&str, &str)> = r
        .actions
        .iter()
        .map(|a| (a.action.as_str(), a.rule.as_str()))
        .collect();
    assert_eq!(
        actions,
        [
            (
                "create serviceaccounts/default/token (bound to the Secret)",
                "the Secret has no token"
            ),
            (
                "update Secret bot-token (fill in token, ca.crt, namespace, the uid annotation)",
                "its ServiceAccount exists, and these are missing or stale"
            ),
        ]
    );

    let aggregated = eventually("the aggregation record", || async {
        acted(
            setpoint_controllers::clusterroleaggregation::NAME,
            "why-agg",
        )
    })
    .await;
    let r = &aggregated[0];
    assert_eq!(
        r.observed,
        ["1 selector(s) match 1 ClusterRole(s): why-agg-a; 1 rule(s) in their union, 0 in the role"],
        "{r:?}"
    );
    assert_eq!(r.actions[0].action, "update rules (1 rule(s))");
    assert_eq!(
        r.actions[0].rule,
        "the union of the matched ClusterRoles' rules differs from the role's"
    );

    // Neither the CA nor the token is in any record.
    for r in created.iter().chain(&published).chain(&filled) {
        let text = serde_json::to_string(&**r).unwrap();
        assert!(!text.contains("BEGIN") && !text.contains("V0hZ"), "{text}");
        assert!(!text.contains(&token), "{text}");
    }
    cluster.stop().await;
}
