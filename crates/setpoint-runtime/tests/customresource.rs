//! `#[derive(CustomResource)]` end to end: the generated CRD is accepted by a real API server,
//! and the generated type round-trips through `Api<K>` (create, get, status, list).

use serde::{Deserialize, Serialize};
use setpoint_runtime::client::{
    Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use setpoint_runtime::schemars::JsonSchema;
use setpoint_runtime::CustomResource;
use setpoint_testing::{eventually, TestCluster};

/// A scheduled backup of one database.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[resource(group = "example.com", version = "v1", kind = "CronBackup", namespaced)]
#[resource(status = "CronBackupStatus", shortname = "cb", category = "all")]
#[resource(printcolumn = r#"{"name":"Schedule","type":"string","jsonPath":".spec.schedule"}"#)]
#[serde(rename_all = "camelCase")]
#[schemars(crate = "setpoint_runtime::schemars")]
pub struct CronBackupSpec {
    /// When to back up, in cron syntax.
    #[serde(default = "default_schedule")]
    #[schemars(default = "default_schedule")]
    pub schedule: String,
    /// The database to back up.
    pub database: String,
    /// How long backups are kept.
    pub retention_days: Option<i64>,
}

fn default_schedule() -> String {
    "0 2 * * *".into()
}

/// What the operator observed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(crate = "setpoint_runtime::schemars")]
pub struct CronBackupStatus {
    /// A human-readable summary of the last backup.
    pub message: Option<String>,
    /// The `metadata.generation` the operator last acted on.
    pub observed_generation: Option<i64>,
}

#[test]
fn the_generated_type_and_definition() {
    use k8s_openapi::Resource;
    assert_eq!(CronBackup::API_VERSION, "example.com/v1");
    assert_eq!(CronBackup::URL_PATH_SEGMENT, "cronbackups");
    let crd = serde_json::to_value(CronBackup::crd()).unwrap();
    assert_eq!(crd["metadata"]["name"], "cronbackups.example.com");
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    let spec = &schema["properties"]["spec"];
    assert_eq!(spec["properties"]["schedule"]["default"], "0 2 * * *");
    assert_eq!(spec["properties"]["retentionDays"]["nullable"], true);
    assert_eq!(spec["required"], serde_json::json!(["database"]));
    assert_eq!(
        schema["properties"]["status"]["properties"]["message"]["type"],
        "string"
    );
    let obj = CronBackup::new(
        "nightly",
        CronBackupSpec {
            schedule: "5 * * * *".into(),
            database: "orders".into(),
            retention_days: None,
        },
    );
    let v = serde_json::to_value(&obj).unwrap();
    assert_eq!(v["apiVersion"], "example.com/v1");
    assert_eq!(v["kind"], "CronBackup");
    assert!(v.get("status").is_none());
    let back: CronBackup = serde_json::from_value(v).unwrap();
    assert_eq!(back.spec, obj.spec);
}

#[tokio::test]
async fn the_definition_is_served_and_the_type_round_trips() {
    let cluster = TestCluster::start().await;
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
    let crd = DynamicObject(serde_json::to_value(CronBackup::crd()).unwrap());
    crds.create(&PostParams::default(), &crd).await.unwrap();
    let api: Api<CronBackup> = Api::namespaced(client.clone(), "default");
    let created = eventually("the CronBackup resource to be served", || async {
        let spec: CronBackupSpec =
            serde_json::from_value(serde_json::json!({"database": "orders"})).unwrap();
        api.create(&PostParams::default(), &CronBackup::new("nightly", spec))
            .await
            .ok()
    })
    .await;
    assert_eq!(
        created.spec.schedule, "0 2 * * *",
        "the schema's default applies"
    );
    assert_eq!(created.metadata.generation, Some(1));
    api.patch_status(
        "nightly",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {"message": "ok", "observedGeneration": 1}})),
    )
    .await
    .unwrap();
    let got = api.get("nightly").await.unwrap();
    assert_eq!(got.status.unwrap().message.as_deref(), Some("ok"));
    assert_eq!(
        api.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    cluster.stop().await;
}
