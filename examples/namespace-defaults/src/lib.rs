//! An example operator built only on `setpoint-runtime`'s public API.
//!
//! For every Namespace it keeps a ConfigMap `team-defaults` whose data mirrors the
//! namespace's `defaults.example.com/*` labels. The ConfigMap is owned by the Namespace, so
//! the controller is woken when someone edits or deletes it, and puts it back.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use setpoint_runtime::client::{Api, Client, ClientError, PostParams};
use setpoint_runtime::controller::{Action, Context, Controller, ReconcileError, Reconciler};
use setpoint_runtime::events::{EventRecorder, EventType, Reporter, ToObjectReference};
use setpoint_runtime::informer::{Scope, SharedInformers, Store};
use setpoint_runtime::ObjectKey;

/// The ConfigMap the operator maintains in every namespace.
pub const CONFIG_MAP: &str = "team-defaults";
/// Labels with this prefix on a namespace become keys of its ConfigMap.
pub const LABEL_PREFIX: &str = "defaults.example.com/";

/// The pure decision: the ConfigMap a namespace should have (None while it terminates).
pub fn desired_config_map(ns: &Namespace) -> Option<ConfigMap> {
    if ns.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let name = ns.metadata.name.clone()?;
    let data: BTreeMap<String, String> = ns
        .metadata
        .labels
        .iter()
        .flatten()
        .filter_map(|(k, v)| {
            k.strip_prefix(LABEL_PREFIX)
                .map(|k| (k.to_string(), v.clone()))
        })
        .collect();
    Some(ConfigMap {
        metadata: ObjectMeta {
            name: Some(CONFIG_MAP.into()),
            namespace: Some(name.clone()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Namespace".into(),
                name,
                uid: ns.metadata.uid.clone().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    })
}

/// The reconciler: reads the namespace and its ConfigMap from the caches, writes the gap.
pub struct NamespaceDefaults {
    client: Client,
    namespaces: Store<Namespace>,
    config_maps: Store<ConfigMap>,
    recorder: EventRecorder,
}

#[async_trait::async_trait]
impl Reconciler for NamespaceDefaults {
    async fn reconcile(&self, _ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(ns) = self.namespaces.get(key) else {
            return Ok(Action::Done);
        };
        tracing::info!(namespace = %key.name, "reconciling");
        let Some(want) = desired_config_map(&ns) else {
            return Ok(Action::Done);
        };
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &key.name);
        let have = self
            .config_maps
            .get(&ObjectKey::new(Some(&key.name), CONFIG_MAP));
        match have {
            None => match api.create(&PostParams::default(), &want).await {
                Ok(_) => self.recorder.publish(
                    &ns.object_reference(),
                    EventType::Normal,
                    "Created",
                    &format!("Created ConfigMap {CONFIG_MAP}"),
                ),
                // The cache was behind: the next event brings the object and reconciles again.
                Err(e) if e.is_already_exists() => {}
                Err(e) => return Err(refused(&key.name, "create", e)),
            },
            Some(cm) if cm.data != want.data => {
                let mut fixed = (*cm).clone();
                fixed.data = want.data;
                api.replace(CONFIG_MAP, &PostParams::default(), &fixed)
                    .await
                    .map_err(|e| refused(&key.name, "update", e))?;
                self.recorder.publish(
                    &ns.object_reference(),
                    EventType::Normal,
                    "Updated",
                    "Restored ConfigMap data",
                );
            }
            Some(_) => {}
        }
        Ok(Action::Done)
    }
}

/// The reconcile error for a failed write; a 403 is also logged as what it means: the
/// operator's identity (in a pod, its service account) lacks an RBAC permission, which no
/// retry fixes until someone grants it.
fn refused(namespace: &str, verb: &str, e: ClientError) -> ReconcileError {
    if e.code() == Some(403) {
        tracing::error!(
            namespace,
            verb,
            error = %e,
            "forbidden: RBAC does not allow this operator to {verb} ConfigMaps; bind its service account to the namespace-defaults ClusterRole (see README.md)"
        );
    }
    e.into()
}

/// Builds the controller: reconciles Namespaces, owns their ConfigMaps.
pub fn controller(client: Client, informers: &SharedInformers) -> Controller {
    let reconciler = NamespaceDefaults {
        client: client.clone(),
        namespaces: informers.typed::<Namespace>(Scope::all()).store(),
        config_maps: informers.typed::<ConfigMap>(Scope::all()).store(),
        recorder: EventRecorder::new(client, Reporter::new("namespace-defaults")),
    };
    Controller::for_type::<Namespace>("namespace-defaults", informers, None)
        .owns::<Namespace, ConfigMap>(None)
        .build(Arc::new(reconciler))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn desired_state_comes_from_labels() {
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "team-a", "uid": "u1", "labels": {"defaults.example.com/tier": "gold", "other": "x"}}
        }))
        .unwrap();
        let cm = desired_config_map(&ns).unwrap();
        assert_eq!(cm.metadata.namespace.as_deref(), Some("team-a"));
        assert_eq!(
            cm.data.unwrap().get("tier").map(String::as_str),
            Some("gold")
        );
        assert_eq!(cm.metadata.owner_references.unwrap()[0].uid, "u1");
    }
}
