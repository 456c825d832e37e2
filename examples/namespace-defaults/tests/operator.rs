//! The operator against a real in-process API server.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use serde_json::json;
use setpoint_runtime::client::{Api, DeleteParams, Patch, PatchParams, PostParams};
use setpoint_runtime::informer::SharedInformers;

async fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>, mut poke: impl FnMut()) -> T {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Some(v) = f() {
                return v;
            }
            poke();
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

#[tokio::test]
async fn keeps_every_namespace_supplied() {
    let cluster = setpoint_testing::TestCluster::start().await;
    let client = cluster.client();
    let informers = SharedInformers::new(client.clone());
    let run = tokio::spawn(
        namespace_defaults::controller(client.clone(), &informers).run(std::future::pending()),
    );

    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(
        json!({"metadata": {"name": "team-a", "labels": {"defaults.example.com/tier": "gold"}}}),
    )
    .unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "team-a");
    let store = informers
        .typed::<ConfigMap>(setpoint_runtime::informer::Scope::all())
        .store();
    let key = setpoint_runtime::ObjectKey::new(Some("team-a"), namespace_defaults::CONFIG_MAP);
    let has = |want: &'static str| {
        let store = store.clone();
        let key = key.clone();
        move || {
            store
                .get(&key)
                .filter(|c| {
                    c.data
                        .as_ref()
                        .and_then(|d| d.get("tier"))
                        .map(String::as_str)
                        == Some(want)
                })
                .map(|_| ())
        }
    };
    eventually("the ConfigMap", has("gold"), || {}).await;

    // Someone edits it: the operator puts it back.
    cms.patch(
        namespace_defaults::CONFIG_MAP,
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"tier": "bronze"}})),
    )
    .await
    .unwrap();
    eventually("the ConfigMap restored", has("gold"), || {}).await;

    // Someone deletes it: the operator recreates it.
    cms.delete(namespace_defaults::CONFIG_MAP, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the ConfigMap recreated", has("gold"), || {}).await;

    // The namespace's labels change: the data follows.
    namespaces
        .patch(
            "team-a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"defaults.example.com/tier": "silver"}}})),
        )
        .await
        .unwrap();
    eventually("the ConfigMap updated", has("silver"), || {}).await;
    run.abort();
}
