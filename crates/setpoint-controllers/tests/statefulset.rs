//! The StatefulSet controller against a real in-process API server with the built-in
//! controllers (the garbage collector carries out the claims' retention policy).
//!
//! No node agent runs here: a stand-in marks pods Running and Ready through the status
//! subresource, as a node would, when the test lets it.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Pod};
use serde_json::json;
use setpoint_runtime::client::{
    Api, Client, DeleteParams, ListParams, Patch, PatchParams, PostParams,
};
use setpoint_runtime::decision::{self, DecisionRecord};
use setpoint_runtime::informer::{Event, Scope, SharedInformers};
use setpoint_testing::TestCluster;

/// Polls `check` until it returns `Some`, or panics after 30 s.
async fn eventually<T, F: Future<Output = Option<T>>>(what: &str, check: impl FnMut() -> F) -> T {
    setpoint_testing::eventually_within(Duration::from_secs(30), what, check).await
}

/// Marks every pod of `ns` Running and Ready while `on` is set, as a node would.
fn stand_in_node(client: Client, ns: &str, on: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
    let ns = ns.to_string();
    tokio::spawn(async move {
        let informers = SharedInformers::new(client.clone());
        let informer = informers.typed::<Pod>(Scope::namespace(&ns));
        let changed = Arc::new(tokio::sync::Notify::new());
        let notify = changed.clone();
        let _sub = informer.subscribe(Arc::new(move |_: &Event<Pod>| notify.notify_one()));
        let api: Api<Pod> = Api::namespaced(client, &ns);
        let _ = informer.wait_synced().await;
        loop {
            if on.load(Ordering::SeqCst) {
                for p in informer.store().list() {
                    let ready = p
                        .status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready"));
                    if ready || p.metadata.deletion_timestamp.is_some() {
                        continue;
                    }
                    let _ = api
                        .patch_status(
                            p.metadata.name.as_deref().unwrap_or_default(),
                            &PatchParams::default(),
                            &Patch::Merge(json!({"status": {
                                "phase": "Running",
                                "conditions": [{"type": "Ready", "status": "True",
                                                "lastTransitionTime": "2020-01-01T00:00:00Z"}]
                            }})),
                        )
                        .await;
                }
            }
            // A lost wake-up costs at most this long; the loop re-reads the cache anyway.
            let _ = tokio::time::timeout(Duration::from_millis(200), changed.notified()).await;
        }
    })
}

/// The finished decision records of the `statefulset` controller about `{ns}/{name}` so far.
fn decisions(ns: &str, name: &str) -> Vec<Arc<DecisionRecord>> {
    decision::ring()
        .about("statefulset", name)
        .into_iter()
        .filter(|r| r.object.namespace == ns)
        .collect()
}

async fn namespace(client: &Client, name: &str) {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
}

fn stateful_set(extra: serde_json::Value) -> StatefulSet {
    let mut body = json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 3,
            "serviceName": "web",
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": "nginx:1"}]}
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "www"},
                "spec": {"accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "1Gi"}}}
            }]
        }
    });
    for (k, v) in extra.as_object().unwrap() {
        body["spec"][k] = v.clone();
    }
    serde_json::from_value(body).unwrap()
}

async fn live_names(api: &Api<Pod>) -> Vec<String> {
    let mut names: Vec<String> = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.metadata.name)
        .collect();
    names.sort();
    names
}

async fn claim_names(api: &Api<PersistentVolumeClaim>) -> Vec<String> {
    let mut names: Vec<String> = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .filter_map(|c| c.metadata.name)
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn parallel_pods_and_claims_deleted_per_retention_policy() {
    let cluster = TestCluster::start_with_controllers().await;
    let client = cluster.client();
    namespace(&client, "par").await;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), "par");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "par");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "par");
    let ready = Arc::new(AtomicBool::new(false));
    let node = stand_in_node(client.clone(), "par", ready.clone());

    let set = stateful_set(json!({
        "podManagementPolicy": "Parallel",
        "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Delete"},
    }));
    let created = sets.create(&PostParams::default(), &set).await.unwrap();
    let uid = created.metadata.uid.clone().unwrap();
    // Parallel: all three at once, without any being Ready.
    eventually("three pods, none ready", || async {
        (live_names(&pods).await == ["web-0", "web-1", "web-2"]).then_some(())
    })
    .await;
    let want_claims = ["www-web-0", "www-web-1", "www-web-2"];
    assert_eq!(claim_names(&claims).await, want_claims);
    // The decision that made web-2 says what it saw and which rule chose the pod.
    let made = |r: &DecisionRecord| {
        r.actions
            .iter()
            .find(|a| a.action.starts_with("create pod web-2 at revision web-"))
            .cloned()
    };
    let (record, create) = eventually("the decision record creating web-2", || async {
        decisions("par", "web")
            .into_iter()
            .find_map(|r| Some((r.clone(), made(&r)?)))
    })
    .await;
    assert!(
        record.observed.iter().any(|o| o.starts_with("3 desired, ")
            && o.contains("; Parallel, RollingUpdate (partition 0, maxUnavailable 1)")),
        "{record:?}"
    );
    assert_eq!(create.rule, "ordinal 2 < 3 replicas has no pod (Parallel)");
    assert!(
        record
            .actions
            .iter()
            .any(|a| a.action == "create claim www-web-2" && !a.rule.is_empty()),
        "{record:?}"
    );
    // whenDeleted: Delete — the claims are owned by the set (not as its controller).
    let owned = eventually("claims owned by the set", || async {
        let list = claims.list(&ListParams::default()).await.unwrap().items;
        list.iter()
            .all(|c| {
                c.metadata.owner_references.as_ref().is_some_and(|r| {
                    r.len() == 1 && r[0].uid == uid && r[0].controller != Some(true)
                })
            })
            .then_some(list)
    })
    .await;
    assert_eq!(owned.len(), 3);
    ready.store(true, Ordering::SeqCst);
    eventually("three ready replicas", || async {
        let s = sets.get("web").await.unwrap().status.unwrap_or_default();
        (s.ready_replicas == Some(3) && s.replicas == 3).then_some(())
    })
    .await;

    // whenScaled: Delete — the claims of removed pods go with them.
    sets.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 1}})),
    )
    .await
    .unwrap();
    eventually("one pod and its claim left", || async {
        (live_names(&pods).await == ["web-0"] && claim_names(&claims).await == ["www-web-0"])
            .then_some(())
    })
    .await;
    let delete = eventually("the decision record deleting web-2", || async {
        decisions("par", "web")
            .iter()
            .flat_map(|r| r.actions.clone())
            .find(|a| a.action == "delete pod web-2")
    })
    .await;
    assert_eq!(
        delete.rule,
        "ordinal 2 >= 1 replicas: scale down (Parallel)"
    );

    // Deleting the set takes its pods and (whenDeleted: Delete) the remaining claim.
    sets.delete("web", &DeleteParams::default()).await.unwrap();
    eventually("pods and claims gone", || async {
        (live_names(&pods).await.is_empty() && claim_names(&claims).await.is_empty()).then_some(())
    })
    .await;
    node.abort();
    cluster.stop().await;
}

#[tokio::test]
async fn on_delete_failed_pods_adoption_and_ordinal_start() {
    let cluster = TestCluster::start_with_controllers().await;
    let client = cluster.client();
    namespace(&client, "od").await;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), "od");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "od");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "od");
    let node = stand_in_node(client.clone(), "od", Arc::new(AtomicBool::new(true)));

    // An orphan with a member's name and the set's labels is adopted, not replaced.
    let orphan: Pod = serde_json::from_value(json!({
        "metadata": {"name": "web-5", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "nginx:1"}]}
    }))
    .unwrap();
    let orphan_uid = pods
        .create(&PostParams::default(), &orphan)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let set = stateful_set(json!({
        "replicas": 2,
        "ordinals": {"start": 5},
        "updateStrategy": {"type": "OnDelete"},
    }));
    sets.create(&PostParams::default(), &set).await.unwrap();
    eventually("web-5 and web-6 ready", || async {
        let s = sets.get("web").await.unwrap().status.unwrap_or_default();
        (live_names(&pods).await == ["web-5", "web-6"] && s.ready_replicas == Some(2)).then_some(())
    })
    .await;
    let adopted = pods.get("web-5").await.unwrap();
    assert_eq!(adopted.metadata.uid.as_deref(), Some(orphan_uid.as_str()));
    let refs = adopted.metadata.owner_references.unwrap();
    assert_eq!(
        (refs[0].kind.as_str(), refs[0].controller),
        ("StatefulSet", Some(true))
    );
    // Adopted pods get their identity labels.
    eventually("web-5 relabelled", || async {
        let labels = pods
            .get("web-5")
            .await
            .unwrap()
            .metadata
            .labels
            .unwrap_or_default();
        (labels
            .get("apps.kubernetes.io/pod-index")
            .map(String::as_str)
            == Some("5"))
        .then_some(())
    })
    .await;
    // Claims are per ordinal from the start; the adopted pod's claim is made too, though
    // its volumes (made by someone else) do not name it.
    eventually("claims of both ordinals", || async {
        let names = claim_names(&claims).await;
        (names == ["www-web-5", "www-web-6"]).then_some(())
    })
    .await;
    let first = sets.get("web").await.unwrap().status.unwrap();
    let first_revision = first.current_revision.clone().unwrap();

    // OnDelete: a new template changes no pod until one is deleted.
    sets.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "nginx:2"}]}}}})),
    )
    .await
    .unwrap();
    let update = eventually("a new update revision", || async {
        let s = sets.get("web").await.unwrap().status.unwrap_or_default();
        s.update_revision.filter(|r| *r != first_revision)
    })
    .await;
    let uid6 = pods.get("web-6").await.unwrap().metadata.uid;
    pods.delete("web-6", &DeleteParams::default())
        .await
        .unwrap();
    eventually("web-6 back at the update revision", || async {
        let p = pods.get_opt("web-6").await.unwrap()?;
        let rev = p
            .metadata
            .labels
            .as_ref()?
            .get("controller-revision-hash")?
            .clone();
        (p.metadata.uid != uid6 && rev == update).then_some(())
    })
    .await;
    // The adopted pod carries no revision label: it counts as neither current nor updated,
    // and under OnDelete it stays as it is.
    let s = eventually("status counts the updated pod", || async {
        let s = sets.get("web").await.unwrap().status.unwrap_or_default();
        (s.replicas == 2 && s.updated_replicas == Some(1) && s.current_replicas == Some(0))
            .then_some(s)
    })
    .await;
    assert_eq!(s.current_revision.as_deref(), Some(first_revision.as_str()));
    let web5 = pods.get("web-5").await.unwrap();
    assert_eq!(web5.metadata.uid.as_deref(), Some(orphan_uid.as_str()));

    // A Failed pod is deleted and made again under its name.
    pods.patch_status(
        "web-5",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Failed"}})),
    )
    .await
    .unwrap();
    eventually("web-5 replaced", || async {
        let p = pods.get_opt("web-5").await.unwrap()?;
        (p.metadata.uid.as_deref() != Some(orphan_uid.as_str())
            && p.metadata.deletion_timestamp.is_none())
        .then_some(())
    })
    .await;
    node.abort();
    cluster.stop().await;
}

#[tokio::test]
async fn an_orphan_revision_of_the_template_is_adopted_not_copied() {
    let cluster = TestCluster::start_with_controllers().await;
    let client = cluster.client();
    namespace(&client, "adopt").await;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), "adopt");
    let revisions: Api<ControllerRevision> = Api::namespaced(client.clone(), "adopt");
    let node = stand_in_node(client.clone(), "adopt", Arc::new(AtomicBool::new(true)));

    // The revision a set of this template left behind when it was deleted with
    // `--cascade=orphan`: selected by the new set, with the template as its data (as the
    // server stores it, defaults filled in: a dry run shows them).
    let set = stateful_set(json!({"replicas": 1}));
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let stored = sets.create(&dry, &set).await.unwrap();
    let template = serde_json::to_value(&stored.spec.as_ref().unwrap().template).unwrap();
    let mut data = json!({"spec": {"template": template}});
    data["spec"]["template"]["$patch"] = json!("replace");
    let orphan: ControllerRevision = serde_json::from_value(json!({
        "metadata": {"name": "web-old", "labels": {"app": "web"}},
        "data": data,
        "revision": 4,
    }))
    .unwrap();
    revisions
        .create(&PostParams::default(), &orphan)
        .await
        .unwrap();
    let created = sets.create(&PostParams::default(), &set).await.unwrap();
    let uid = created.metadata.uid.unwrap();

    let status = eventually("the set ready on the adopted revision", || async {
        let s = sets.get("web").await.unwrap().status.unwrap_or_default();
        (s.ready_replicas == Some(1)).then_some(s)
    })
    .await;
    assert_eq!(status.update_revision.as_deref(), Some("web-old"));
    assert_eq!(status.current_revision.as_deref(), Some("web-old"));
    let all = revisions.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(all.len(), 1, "{all:?}");
    let refs = all[0].metadata.owner_references.clone().unwrap();
    assert_eq!(
        (refs[0].uid.as_str(), refs[0].controller),
        (uid.as_str(), Some(true))
    );
    assert_eq!(all[0].revision, 4);
    node.abort();
    cluster.stop().await;
}
