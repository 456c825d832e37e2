//! The ResourceQuota controller: keeps each quota's `status.hard` equal to `spec.hard` and
//! `status.used` equal to what the namespace's objects cost ([`setpoint_api::quota`], the
//! same rules the API server's admission charges by).
//!
//! A change to a pod, service, ConfigMap, Secret or ReplicationController wakes every quota
//! of its namespace, so usage follows deletes and pods finishing at once rather than on a
//! period. Other resources (`count/<resource>.<group>`, and PersistentVolumeClaims where a
//! server serves them) are counted by listing them, and those quotas are recomputed every
//! [`LISTED_RECHECK`]. [`status`] is the pure decision.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    ConfigMap, Pod, ReplicationController, ResourceQuota, Secret, Service,
};
use serde_json::{json, Value};
use setpoint_api::quota as q;
use setpoint_runtime::client::{Api, Client, DynamicObject, ListParams, PostParams};
use setpoint_runtime::controller::{
    Action, Context, Controller, ControllerOptions, ReconcileError, Reconciler,
};
use setpoint_runtime::informer::{Scope, SharedInformers, Store, NAMESPACE_INDEX};
use setpoint_runtime::ObjectKey;

use crate::discovery::{self, ServedResource};

/// The controller's name (work queue, metrics, logs).
pub const NAME: &str = "resourcequota";
/// How often a quota that counts resources without a cache here is recomputed.
pub const LISTED_RECHECK: Duration = Duration::from_secs(10);
/// How long a discovery answer is reused.
const DISCOVERY_TTL: Duration = Duration::from_secs(30);
/// Every quota is recounted at least this often (kube-controller-manager's
/// `--resource-quota-sync-period`): a charge whose create then failed is given back by then.
pub const RESYNC: Duration = Duration::from_secs(300);

/// The quota's status as it should be: `hard` = `spec.hard`, `used` from `objects` (each
/// with its group and plural). `None` when the current status already says so.
pub fn status<'a>(
    quota: &Value,
    objects: impl IntoIterator<Item = (&'a str, &'a str, &'a Value)>,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<Value> {
    let hard = q::parse_list(quota.pointer("/spec/hard"));
    let used = q::compute_used(quota, &hard, objects, now);
    let current_hard = q::parse_list(quota.pointer("/status/hard"));
    let current_used = q::parse_list(quota.pointer("/status/used"));
    if current_hard == hard && current_used == used {
        return None;
    }
    Some(json!({"hard": q::to_json(&hard), "used": q::to_json(&used)}))
}

/// `used/hard` of each resource, e.g. `pods 2/10, requests.cpu 500m/2` (the decision
/// record's summary).
fn used_vs_hard(used: Option<&Value>, hard: Option<&Value>) -> String {
    let text = |v: Option<&Value>, k: &str| {
        v.and_then(|v| v.get(k))
            .and_then(Value::as_str)
            .unwrap_or("0")
            .to_string()
    };
    let parts: Vec<String> = hard
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, _)| format!("{k} {}/{}", text(used, k), text(hard, k)))
        .collect();
    if parts.is_empty() {
        "no hard limits".into()
    } else {
        parts.join(", ")
    }
}

/// What a status write changes: `used pods 1 -> 2`, `hard pods 10 -> 20`.
fn status_changes(old: Option<&Value>, new: &Value) -> String {
    let mut out = Vec::new();
    for field in ["hard", "used"] {
        let before = old.and_then(|o| o.get(field));
        let after = new.get(field);
        let keys: std::collections::BTreeSet<&String> = [before, after]
            .into_iter()
            .flatten()
            .filter_map(Value::as_object)
            .flat_map(|m| m.keys())
            .collect();
        for k in keys {
            let b = before.and_then(|v| v.get(k)).and_then(Value::as_str);
            let a = after.and_then(|v| v.get(k)).and_then(Value::as_str);
            if b != a {
                out.push(format!(
                    "{field} {k} {} -> {}",
                    b.unwrap_or("none"),
                    a.unwrap_or("none")
                ));
            }
        }
    }
    if out.is_empty() {
        "the status is written anew".into()
    } else {
        out.join(", ")
    }
}

/// The caches of the kinds whose changes recompute quotas.
#[derive(Clone)]
struct Caches {
    pods: Store<Pod>,
    services: Store<Service>,
    config_maps: Store<ConfigMap>,
    secrets: Store<Secret>,
    controllers: Store<ReplicationController>,
}

impl Caches {
    /// The namespace's objects of a cached core resource, as JSON; `None` when this
    /// resource has no cache here.
    fn objects(&self, plural: &str, namespace: &str) -> Option<Vec<Value>> {
        fn json<K>(store: &Store<K>, ns: &str) -> Vec<Value>
        where
            K: setpoint_runtime::Object,
        {
            store
                .by_index(NAMESPACE_INDEX, ns)
                .iter()
                .filter_map(|o| serde_json::to_value(&**o).ok())
                .collect()
        }
        Some(match plural {
            "pods" => json(&self.pods, namespace),
            "services" => json(&self.services, namespace),
            "configmaps" => json(&self.config_maps, namespace),
            "secrets" => json(&self.secrets, namespace),
            "replicationcontrollers" => json(&self.controllers, namespace),
            _ => return None,
        })
    }
}

struct QuotaController {
    client: Client,
    quotas: Store<ResourceQuota>,
    caches: Caches,
    discovered: Mutex<Option<(Instant, Vec<ServedResource>)>>,
}

impl QuotaController {
    async fn served(&self) -> Result<Vec<ServedResource>, ReconcileError> {
        if let Some((at, r)) = &*self.discovered.lock().unwrap_or_else(|e| e.into_inner()) {
            if at.elapsed() < DISCOVERY_TTL {
                return Ok(r.clone());
            }
        }
        let all = discovery::served_resources(&self.client)
            .await
            .map_err(ReconcileError::retry)?;
        *self.discovered.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((Instant::now(), all.clone()));
        Ok(all)
    }

    /// Lists a resource without a cache here, in one namespace.
    async fn listed(
        &self,
        group: &str,
        plural: &str,
        namespace: &str,
    ) -> Result<Vec<Value>, ReconcileError> {
        let served = self.served().await?;
        let Some(r) = served.iter().find(|r| {
            r.resource.group == group && r.resource.plural == plural && r.resource.namespaced
        }) else {
            // Not served (yet): nothing of it exists to count.
            return Ok(vec![]);
        };
        let api: Api<DynamicObject> =
            Api::dynamic(self.client.clone(), &r.resource, Some(namespace));
        let list = api.list_all(&ListParams::default()).await?;
        Ok(list.items.into_iter().map(|o| o.0).collect())
    }
}

#[async_trait::async_trait]
impl Reconciler for QuotaController {
    async fn reconcile(&self, ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(quota) = self.quotas.get(key) else {
            ctx.observe("the ResourceQuota is gone");
            return Ok(Action::Done);
        };
        let namespace = key.namespace.clone().unwrap_or_default();
        let quota = serde_json::to_value(&*quota).map_err(ReconcileError::retry)?;
        let hard = q::parse_list(quota.pointer("/spec/hard"));
        // Which resources the hard limits are computed from.
        let mut sources: BTreeMap<(String, String), Vec<Value>> = BTreeMap::new();
        let mut listed = false;
        for name in hard.keys() {
            if let Some(src) = q::source_of(name) {
                sources.entry(src).or_default();
            }
        }
        for ((group, plural), objects) in sources.iter_mut() {
            let cached = group
                .is_empty()
                .then(|| self.caches.objects(plural, &namespace))
                .flatten();
            *objects = match cached {
                Some(o) => o,
                None => {
                    listed = true;
                    self.listed(group, plural, &namespace).await?
                }
            };
        }
        let all = sources
            .iter()
            .flat_map(|((g, p), objs)| objs.iter().map(move |o| (g.as_str(), p.as_str(), o)));
        let next = if listed {
            Action::RequeueAfter(LISTED_RECHECK)
        } else {
            Action::Done
        };
        let Some(new_status) = status(&quota, all, chrono::Utc::now()) else {
            setpoint_runtime::decision::observe_with(|| {
                format!(
                    "used/hard: {}; the status says so",
                    used_vs_hard(quota.pointer("/status/used"), quota.pointer("/status/hard"))
                )
            });
            return Ok(next);
        };
        if ctx.recording() {
            ctx.observe(format!(
                "used/hard: {}",
                used_vs_hard(new_status.get("used"), new_status.get("hard"))
            ));
            ctx.action(
                "update status",
                format!(
                    "the recount differs from the status: {}",
                    status_changes(quota.get("status"), &new_status)
                ),
            );
        }
        let mut updated = quota.clone();
        updated["status"] = new_status;
        if let Some(m) = updated
            .pointer_mut("/metadata")
            .and_then(Value::as_object_mut)
        {
            m.remove("managedFields");
        }
        let updated: ResourceQuota =
            serde_json::from_value(updated).map_err(ReconcileError::retry)?;
        let api: Api<ResourceQuota> = Api::namespaced(self.client.clone(), &namespace);
        // The cached resourceVersion makes this a compare-and-swap: if admission charged
        // the quota meanwhile, 409 and a retry on the newer version.
        match api
            .replace_status(&key.name, &PostParams::default(), &updated)
            .await
        {
            Ok(_) => Ok(next),
            // Changed meanwhile (admission charged it): its update event brings it back.
            Err(e) if e.is_not_found() || e.is_conflict() => Ok(Action::Done),
            Err(e) => Err(e.into()),
        }
    }
}

/// Every quota key of a namespace (what an object's change there wakes).
fn quotas_of(quotas: &Store<ResourceQuota>, namespace: Option<&str>) -> Vec<ObjectKey> {
    namespace
        .map(|ns| quotas.index_keys(NAMESPACE_INDEX, ns))
        .unwrap_or_default()
}

/// Builds the ResourceQuota controller.
pub fn controller(client: Client, informers: &SharedInformers) -> Controller {
    let quotas = informers.typed::<ResourceQuota>(Scope::all()).store();
    let caches = Caches {
        pods: informers.typed::<Pod>(Scope::all()).store(),
        services: informers.typed::<Service>(Scope::all()).store(),
        config_maps: informers.typed::<ConfigMap>(Scope::all()).store(),
        secrets: informers.typed::<Secret>(Scope::all()).store(),
        controllers: informers
            .typed::<ReplicationController>(Scope::all())
            .store(),
    };
    let reconciler = QuotaController {
        client,
        quotas: quotas.clone(),
        caches,
        discovered: Mutex::new(None),
    };
    let (a, b, c, d, e) = (
        quotas.clone(),
        quotas.clone(),
        quotas.clone(),
        quotas.clone(),
        quotas,
    );
    Controller::for_type::<ResourceQuota>(NAME, informers, None)
        .options(ControllerOptions {
            resync: Some(RESYNC),
            ..ControllerOptions::default()
        })
        .watches::<Pod>(None, move |o| {
            quotas_of(&a, o.metadata.namespace.as_deref())
        })
        .watches::<Service>(None, move |o| {
            quotas_of(&b, o.metadata.namespace.as_deref())
        })
        .watches::<ConfigMap>(None, move |o| {
            quotas_of(&c, o.metadata.namespace.as_deref())
        })
        .watches::<Secret>(None, move |o| {
            quotas_of(&d, o.metadata.namespace.as_deref())
        })
        .watches::<ReplicationController>(None, move |o| {
            quotas_of(&e, o.metadata.namespace.as_deref())
        })
        .build(Arc::new(reconciler))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_follows_spec_and_objects() {
        let now = chrono::Utc::now();
        let quota = json!({"metadata": {"name": "q", "namespace": "a"},
            "spec": {"hard": {"pods": "2", "count/configmaps": "5"}}});
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}});
        let cm = json!({"metadata": {"name": "c"}});
        let objs = vec![("", "pods", &pod), ("", "configmaps", &cm)];
        let s = status(&quota, objs.clone(), now).unwrap();
        assert_eq!(
            s,
            json!({"hard": {"pods": "2", "count/configmaps": "5"},
                   "used": {"pods": "1", "count/configmaps": "1"}})
        );
        // Already right: nothing to write.
        let mut settled = quota.clone();
        settled["status"] = s;
        assert_eq!(status(&settled, objs, now), None);
        // A pod deleted: usage goes down.
        let s = status(&settled, vec![("", "configmaps", &cm)], now).unwrap();
        assert_eq!(s["used"], json!({"pods": "0", "count/configmaps": "1"}));
    }
}
