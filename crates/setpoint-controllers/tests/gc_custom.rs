//! The garbage collector follows the served resources: a custom resource defined after the
//! controllers started is collected like any built-in one.

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::json;
use setpoint_runtime::client::{Api, ApiResource, DeleteParams, DynamicObject, PostParams};
use setpoint_testing::{eventually, TestCluster};

#[tokio::test]
async fn custom_objects_owned_by_a_deleted_owner_are_collected() {
    let cluster = TestCluster::start_with_controllers().await;
    let client = cluster.client();
    let crds = Api::<DynamicObject>::dynamic(
        client.clone(),
        &ApiResource::new(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
            false,
        ),
        None,
    );
    crds.create(
        &PostParams::default(),
        &DynamicObject(json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced",
                     "names": {"plural": "widgets", "kind": "Widget"},
                     "versions": [{"name": "v1", "served": true, "storage": true,
                                   "schema": {"openAPIV3Schema": {"type": "object",
                                       "x-kubernetes-preserve-unknown-fields": true}}}]}
        })),
    )
    .await
    .unwrap();
    let widgets = Api::<DynamicObject>::dynamic(
        client.clone(),
        &ApiResource::new("example.com", "v1", "Widget", "widgets", true),
        Some("default"),
    );
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let owner: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "owner"}})).unwrap();
    let owner = cms.create(&PostParams::default(), &owner).await.unwrap();
    let widget = DynamicObject(json!({
        "apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "w", "ownerReferences": [{
            "apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
            "uid": owner.metadata.uid.clone().unwrap()}]},
        "spec": {"size": 1}
    }));
    eventually("the Widget resource to be served", || async {
        widgets.create(&PostParams::default(), &widget).await.ok()
    })
    .await;
    cms.delete("owner", &DeleteParams::background())
        .await
        .unwrap();
    eventually("the orphaned Widget to be collected", || async {
        widgets.get_opt("w").await.unwrap().is_none().then_some(())
    })
    .await;
    cluster.stop().await;
}
