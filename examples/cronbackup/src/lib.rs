//! The CronBackup operator: a `CronBackup` custom resource (schedule, database, retention)
//! reconciled into a CronJob `backup-<name>` that runs the backup.
//!
//! It is written only with `setpoint-runtime`'s public API: the resource type and its CRD
//! come from `#[derive(CustomResource)]`, the controller owns its CronJobs (so an edit or
//! deletion of one wakes it and it puts the CronJob back), and the CronJob carries an owner
//! reference, so deleting a CronBackup lets the garbage collector remove the CronJob.
//!
//! [`desired_cronjob`] is the pure decision; [`CronBackupReconciler`] does the I/O.

use std::sync::Arc;

use k8s_openapi::api::batch::v1::CronJob;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use setpoint_runtime::client::{Api, Client, Patch, PatchParams, PostParams};
use setpoint_runtime::controller::{Action, Context, Controller, ReconcileError, Reconciler};
use setpoint_runtime::events::{EventRecorder, EventType, Reporter, ToObjectReference};
use setpoint_runtime::informer::{Scope, SharedInformers, Store};
use setpoint_runtime::schemars::JsonSchema;
use setpoint_runtime::{CustomResource, ObjectKey};

/// The controller's name (work queue, metrics, field manager, event reporter).
pub const NAME: &str = "cronbackup";

/// A scheduled backup of one database.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[resource(group = "example.com", version = "v1", kind = "CronBackup", namespaced)]
#[resource(status = "CronBackupStatus", shortname = "cbk", category = "all")]
#[resource(printcolumn = r#"{"name":"Schedule","type":"string","jsonPath":".spec.schedule"}"#)]
#[resource(printcolumn = r#"{"name":"Database","type":"string","jsonPath":".spec.database"}"#)]
#[resource(printcolumn = r#"{"name":"Status","type":"string","jsonPath":".status.message"}"#)]
#[serde(rename_all = "camelCase")]
#[schemars(crate = "setpoint_runtime::schemars")]
pub struct CronBackupSpec {
    /// When to back up, in cron syntax.
    #[serde(default = "default_schedule")]
    #[schemars(default = "default_schedule")]
    pub schedule: String,
    /// The database to back up.
    #[schemars(length(min = 1))]
    pub database: String,
    /// How many days backups are kept.
    #[serde(default = "default_retention")]
    #[schemars(default = "default_retention", range(min = 1))]
    pub retention_days: i64,
}

fn default_schedule() -> String {
    "0 2 * * *".into()
}

fn default_retention() -> i64 {
    30
}

/// What the operator last did.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(crate = "setpoint_runtime::schemars")]
pub struct CronBackupStatus {
    /// A human-readable summary.
    pub message: Option<String>,
    /// The generation of the spec this status describes.
    pub observed_generation: Option<i64>,
    /// The CronJob that runs the backups.
    pub cron_job: Option<String>,
}

/// The name of the CronJob of a CronBackup.
pub fn cronjob_name(backup: &str) -> String {
    format!("backup-{backup}")
}

/// The pure decision: the CronJob a CronBackup should have.
pub fn desired_cronjob(cb: &CronBackup) -> CronJob {
    let name = cb.metadata.name.clone().unwrap_or_default();
    let spec = &cb.spec;
    serde_json::from_value(json!({
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {
            "name": cronjob_name(&name),
            "namespace": cb.metadata.namespace,
            "labels": {"app.kubernetes.io/managed-by": NAME, "example.com/cronbackup": name},
            "ownerReferences": [{
                "apiVersion": "example.com/v1", "kind": "CronBackup", "name": name,
                "uid": cb.metadata.uid, "controller": true, "blockOwnerDeletion": true,
            }],
        },
        "spec": {
            "schedule": spec.schedule,
            "concurrencyPolicy": "Forbid",
            "jobTemplate": {"spec": {"backoffLimit": 2, "template": {"spec": {
                "restartPolicy": "OnFailure",
                "containers": [{
                    "name": "backup",
                    "image": "busybox",
                    "command": ["sh", "-c",
                        "echo \"backing up $(DATABASE), keeping $(RETENTION_DAYS) days\""],
                    "env": [
                        {"name": "DATABASE", "value": spec.database},
                        {"name": "RETENTION_DAYS", "value": spec.retention_days.to_string()},
                    ],
                }],
            }}}},
        },
    }))
    .expect("a CronJob built from valid parts decodes")
}

/// The parts of a CronJob the operator owns, for comparing what is with what should be.
fn owned_parts(cj: &CronJob) -> Value {
    let spec = cj.spec.as_ref();
    json!({
        "schedule": spec.map(|s| s.schedule.clone()),
        "concurrencyPolicy": spec.and_then(|s| s.concurrency_policy.clone()),
        "containers": spec
            .and_then(|s| s.job_template.spec.as_ref())
            .map(|j| serde_json::to_value(&j.template.spec).unwrap_or(Value::Null)
                .get("containers").cloned().unwrap_or(Value::Null)),
    })
}

/// Whether `have` has drifted from `want` in what the operator owns.
pub fn drifted(have: &CronJob, want: &CronJob) -> bool {
    // Compare after the server's defaulting only for fields we set: containers are compared
    // by the keys we write.
    let strip = |v: Value| -> Value {
        let mut v = v;
        if let Some(cs) = v.get_mut("containers").and_then(Value::as_array_mut) {
            for c in cs {
                if let Some(m) = c.as_object_mut() {
                    m.retain(|k, _| matches!(k.as_str(), "name" | "image" | "command" | "env"));
                }
            }
        }
        v
    };
    strip(owned_parts(have)) != strip(owned_parts(want))
}

/// The reconciler of CronBackups.
pub struct CronBackupReconciler {
    client: Client,
    backups: Store<CronBackup>,
    cronjobs: Store<CronJob>,
    events: EventRecorder,
}

#[async_trait::async_trait]
impl Reconciler for CronBackupReconciler {
    async fn reconcile(&self, _ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(cb) = self.backups.get(key) else {
            // Deleted: the CronJob's owner reference lets the garbage collector remove it.
            return Ok(Action::Done);
        };
        if cb.metadata.deletion_timestamp.is_some() {
            return Ok(Action::Done);
        }
        let ns = key.namespace.clone().unwrap_or_default();
        let want = desired_cronjob(&cb);
        let name = cronjob_name(&key.name);
        let api: Api<CronJob> = Api::namespaced(self.client.clone(), &ns);
        let have = self.cronjobs.get(&ObjectKey::new(Some(&ns), &name));
        let message = match have {
            None => match api.create(&PostParams::default(), &want).await {
                Ok(_) => {
                    self.events.publish(
                        &cb.object_reference(),
                        EventType::Normal,
                        "Created",
                        &format!("Created CronJob {name}"),
                    );
                    format!("CronJob {name} created")
                }
                // The cache had not seen it yet; the next event reconciles again.
                Err(e) if e.is_already_exists() => format!("CronJob {name} exists"),
                Err(e) => return Err(e.into()),
            },
            Some(cj) if drifted(&cj, &want) => {
                // Server-side apply as this operator: the owned fields go back to the spec's
                // values, fields others set are left alone.
                let params = PatchParams {
                    field_manager: Some(NAME.into()),
                    force: true,
                    ..PatchParams::default()
                };
                let body = serde_json::to_value(&want).map_err(ReconcileError::terminal)?;
                api.patch(&name, &params, &Patch::Apply(body)).await?;
                self.events.publish(
                    &cb.object_reference(),
                    EventType::Normal,
                    "Corrected",
                    &format!("CronJob {name} drifted from the CronBackup; corrected"),
                );
                format!("CronJob {name} corrected")
            }
            Some(_) => format!("CronJob {name} up to date"),
        };
        let status = CronBackupStatus {
            message: Some(message),
            observed_generation: cb.metadata.generation,
            cron_job: Some(name),
        };
        // "up to date" after "created" is the same fact; only write when the generation or
        // the CronJob changed, so a steady state costs no writes.
        let current = cb.status.clone().unwrap_or_default();
        if current.observed_generation != status.observed_generation
            || current.cron_job != status.cron_job
            || status
                .message
                .as_deref()
                .is_some_and(|m| m.ends_with("corrected"))
        {
            let backups: Api<CronBackup> = Api::namespaced(self.client.clone(), &ns);
            backups
                .patch_status(
                    &key.name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": status})),
                )
                .await?;
        }
        Ok(Action::Done)
    }
}

/// Builds the controller: reconciles CronBackups, owns their CronJobs.
pub fn controller(client: Client, informers: &SharedInformers) -> Controller {
    let reconciler = CronBackupReconciler {
        events: EventRecorder::new(client.clone(), Reporter::new(NAME)),
        client,
        backups: informers.typed::<CronBackup>(Scope::all()).store(),
        cronjobs: informers.typed::<CronJob>(Scope::all()).store(),
    };
    Controller::for_type::<CronBackup>(NAME, informers, None)
        .owns::<CronBackup, CronJob>(None)
        .build(Arc::new(reconciler))
}

/// Creates the CRD, or brings an existing one up to date (server-side apply).
pub async fn install_crd(client: &Client) -> Result<(), setpoint_runtime::ClientError> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = CronBackup::crd();
    let name = crd.metadata.name.clone().unwrap_or_default();
    let params = PatchParams {
        field_manager: Some(NAME.into()),
        force: true,
        ..PatchParams::default()
    };
    let body = serde_json::to_value(&crd).expect("a CRD serializes");
    api.patch(&name, &params, &Patch::Apply(body)).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backup(schedule: &str) -> CronBackup {
        let mut cb = CronBackup::new(
            "nightly",
            CronBackupSpec {
                schedule: schedule.into(),
                database: "orders".into(),
                retention_days: 30,
            },
        );
        cb.metadata.namespace = Some("default".into());
        cb.metadata.uid = Some("u1".into());
        cb
    }

    #[test]
    fn the_cronjob_follows_the_backup() {
        let cj = desired_cronjob(&backup("0 2 * * *"));
        assert_eq!(cj.metadata.name.as_deref(), Some("backup-nightly"));
        assert_eq!(cj.spec.as_ref().unwrap().schedule, "0 2 * * *");
        let owner = &cj.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("CronBackup", "u1", Some(true))
        );
        let env = serde_json::to_value(&cj).unwrap();
        assert_eq!(
            env["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["env"][0]
                ["value"],
            "orders"
        );
    }

    #[test]
    fn drift_is_what_the_operator_owns() {
        let want = desired_cronjob(&backup("0 2 * * *"));
        assert!(!drifted(&want, &want));
        let mut edited = want.clone();
        edited.spec.as_mut().unwrap().schedule = "0 5 * * *".into();
        assert!(drifted(&edited, &want));
        // Fields the server or others add are not drift.
        let mut defaulted = want.clone();
        defaulted.spec.as_mut().unwrap().suspend = Some(false);
        defaulted
            .metadata
            .labels
            .get_or_insert_default()
            .insert("team".into(), "a".into());
        assert!(!drifted(&defaulted, &want));
    }

    #[test]
    fn the_crd_has_defaults_and_columns() {
        let crd = serde_json::to_value(CronBackup::crd()).unwrap();
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        assert_eq!(spec["properties"]["schedule"]["default"], "0 2 * * *");
        assert_eq!(spec["properties"]["retentionDays"]["default"], 30);
        assert_eq!(spec["required"], json!(["database"]));
        assert_eq!(
            crd["spec"]["versions"][0]["additionalPrinterColumns"]
                .as_array()
                .unwrap()
                .len(),
            3
        );
    }
}
