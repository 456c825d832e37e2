//! The default StorageClass `setpoint up` ships, as k3s ships its `local-path` class: volumes
//! are directories on the node a claim's first pod is scheduled to.

use serde_json::json;
use setpoint_api::storage as st;
use setpoint_runtime::client::{Api, Client, PostParams};
use setpoint_runtime::client::{ApiResource, DynamicObject};

/// The class: the default, provisioned by the built-in local-path provisioner once the
/// scheduler chose a node (`WaitForFirstConsumer`), deleted with its claim.
pub fn class() -> serde_json::Value {
    json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": st::LOCAL_PATH_CLASS,
            "annotations": {st::DEFAULT_CLASS_ANNOTATION: "true"},
        },
        "provisioner": st::LOCAL_PATH_PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": st::WAIT_FOR_FIRST_CONSUMER,
    })
}

/// Creates the class unless it exists (a user's changes to it are kept across restarts).
pub async fn ensure_class(client: &Client) -> anyhow::Result<()> {
    let resource = ApiResource::new(
        "storage.k8s.io",
        "v1",
        "StorageClass",
        "storageclasses",
        false,
    );
    let api: Api<DynamicObject> = Api::dynamic(client.clone(), &resource, None);
    match api
        .create(&PostParams::default(), &DynamicObject(class()))
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.is_already_exists() => Ok(()),
        Err(e) => Err(anyhow::anyhow!(
            "creating the {} StorageClass: {e}",
            st::LOCAL_PATH_CLASS
        )),
    }
}
