//! The `ResourceQuota` admission step, and where both namespace-policy steps (quota and
//! `LimitRanger`) find the namespace's policy objects.
//!
//! A create that a quota covers is charged to it before the object is stored: the quota's
//! `status.used` grows by the object's cost with a compare-and-swap on the quota's revision,
//! so concurrent creates (on this server or another on the same store) each see the others'
//! charges and the last one that fits wins, as upstream's quota admission does. A charge
//! whose create then fails is given back when the ResourceQuota controller next recomputes
//! usage from what exists.

use serde_json::Value;
use setpoint_api::meta;
use setpoint_api::quota::{self as q, Refusal};
use setpoint_api::status::ApiError;
use setpoint_store::{Precondition, StoreError};

use crate::registry::ResourceDef;
use crate::state::ApiServer;
use crate::watchcache::{decode_object, Filter};

/// How often a charge is retried when other writers keep changing the quota first.
const CAS_ATTEMPTS: usize = 16;

/// Charges to one namespace's quotas take turns on this server (by a lock chosen by the
/// namespace's hash), so its concurrent creates do not spend their compare-and-swap attempts
/// on each other; the compare-and-swap still orders them against other servers and the
/// controller. Upstream's admission likewise works through one namespace's charges at a time.
static TURNS: std::sync::LazyLock<Vec<tokio::sync::Mutex<()>>> =
    std::sync::LazyLock::new(|| (0..64).map(|_| tokio::sync::Mutex::new(())).collect());

fn turn(namespace: &str) -> &'static tokio::sync::Mutex<()> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    namespace.hash(&mut h);
    &TURNS[(h.finish() % TURNS.len() as u64) as usize]
}

impl ApiServer {
    /// The objects of a built-in core resource in one namespace, from the watch cache (the
    /// policy objects admission reads on every create; a write moments old may not be seen,
    /// as with upstream's informer-fed admission).
    pub(crate) fn core_objects_in(&self, plural: &str, namespace: &str) -> Vec<Value> {
        let Some(def) = self.registry().get("", "v1", plural).cloned() else {
            return vec![];
        };
        let cache = self.caches.get(&def.storage_prefix());
        cache
            .list(&def.namespace_prefix(Some(namespace)), &Filter::all())
            .0
            .iter()
            .map(|o| o.object())
            .collect()
    }

    /// `LimitRanger`'s mutating half: fills in a new pod's container defaults.
    pub(crate) fn default_limits(&self, res: &ResourceDef, namespace: &str, obj: &mut Value) {
        if res.group.is_empty() && res.plural == "pods" && !namespace.is_empty() {
            let ranges = self.core_objects_in("limitranges", namespace);
            if !ranges.is_empty() {
                super::limitrange::default_pod(obj, &ranges);
                // The class was derived from the resources as sent (upstream derives it
                // after admission): defaults may have changed it.
                let class = crate::strategy::qos_class(obj);
                if let Some(status) = obj.get_mut("status").and_then(Value::as_object_mut) {
                    status.insert("qosClass".into(), Value::from(class));
                }
            }
        }
    }

    /// `LimitRanger`'s validating half: 403 when a new pod or claim breaks a LimitRange.
    pub(crate) fn check_limits(
        &self,
        res: &ResourceDef,
        namespace: &str,
        obj: &Value,
    ) -> Result<(), ApiError> {
        if !res.group.is_empty()
            || !matches!(res.plural.as_str(), "pods" | "persistentvolumeclaims")
            || namespace.is_empty()
        {
            return Ok(());
        }
        for range in self.core_objects_in("limitranges", namespace) {
            if let Some(msg) = super::limitrange::validate(&res.plural, obj, &range) {
                return Err(forbidden(res, obj, &msg));
            }
        }
        Ok(())
    }

    /// The `ResourceQuota` step for a create of `obj`: refuses it (403) when a quota that
    /// covers it has no computed usage yet or would go over `status.hard`, else charges it
    /// to every such quota (not on a dry run, which only checks).
    pub(crate) async fn charge_quotas(
        &self,
        res: &ResourceDef,
        namespace: &str,
        obj: &Value,
        dry_run: bool,
    ) -> Result<(), ApiError> {
        if !res.namespaced || namespace.is_empty() {
            return Ok(());
        }
        let quotas = self.core_objects_in("resourcequotas", namespace);
        if quotas.is_empty() {
            return Ok(());
        }
        let now = chrono::Utc::now();
        let delta = q::usage(&res.group, &res.plural, obj, now);
        // The cached copies say which quotas apply; each is then checked, and charged, on
        // its latest stored version. Every quota is checked before any is charged, so a
        // refusal by one leaves the others as they were (as upstream's admission).
        let applicable: Vec<&str> = quotas
            .iter()
            .filter(|cached| {
                let hard = q::parse_list(cached.pointer("/status/hard"));
                q::quota_matches(cached, &hard, &res.group, &res.plural, obj)
            })
            .map(meta::name)
            .collect();
        if applicable.is_empty() {
            return Ok(());
        }
        let _turn = turn(namespace).lock().await;
        for check_only in [true, false] {
            if !check_only && dry_run {
                break;
            }
            for name in &applicable {
                self.charge_one(res, namespace, name, obj, &delta, check_only)
                    .await?;
            }
        }
        Ok(())
    }

    async fn charge_one(
        &self,
        res: &ResourceDef,
        namespace: &str,
        quota_name: &str,
        obj: &Value,
        delta: &q::ResourceList,
        dry_run: bool,
    ) -> Result<(), ApiError> {
        let Some(def) = self.registry().get("", "v1", "resourcequotas").cloned() else {
            return Ok(());
        };
        let key = def.key(namespace, quota_name);
        for _ in 0..CAS_ATTEMPTS {
            let kv = match self.store.get(&key).await {
                Ok(Some(kv)) => kv,
                // Deleted since the cache saw it: it limits nothing any more.
                Ok(None) => return Ok(()),
                Err(e) => return Err(ApiError::internal(format!("reading quota: {e}"))),
            };
            let Some(mut quota) = decode_object(&kv.value, kv.mod_revision) else {
                return Err(ApiError::internal(format!(
                    "stored object {key} is not valid JSON"
                )));
            };
            let hard = q::parse_list(quota.pointer("/status/hard"));
            if !q::quota_matches(&quota, &hard, &res.group, &res.plural, obj) {
                return Ok(());
            }
            let used = q::parse_list(quota.pointer("/status/used"));
            let restricted: Vec<&str> = hard
                .keys()
                .filter(|k| q::covers(&res.group, &res.plural, k))
                .map(String::as_str)
                .collect();
            if res.group.is_empty() && res.plural == "pods" {
                if let Err(message) = q::pod_constraints(&restricted, obj) {
                    let refusal = Refusal::Constraints {
                        quota: quota_name.to_string(),
                        message,
                    };
                    return Err(forbidden(res, obj, &refusal.to_string()));
                }
            }
            let new_used = q::charge(quota_name, &restricted, &hard, &used, delta)
                .map_err(|r| forbidden(res, obj, &r.to_string()))?;
            if dry_run || new_used == used {
                return Ok(());
            }
            if let Some(status) = quota
                .as_object_mut()
                .map(|o| o.entry("status").or_insert_with(|| serde_json::json!({})))
            {
                status["used"] = q::to_json(&new_used);
            }
            let value = crate::objects::encode(&quota)?;
            match self
                .store
                .put(&key, value, Precondition::ModRevision(kv.mod_revision))
                .await
            {
                Ok(_) => return Ok(()),
                // Another create (or the controller) changed the quota first: charge again
                // against what it wrote.
                Err(StoreError::Conflict { .. }) => continue,
                Err(StoreError::NotFound { .. }) => return Ok(()),
                Err(e) => return Err(ApiError::internal(format!("updating quota: {e}"))),
            }
        }
        Err(ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on resourcequotas \"{quota_name}\": the object has been modified; please apply your changes to the latest version and try again"
            ),
        ))
    }
}

/// Upstream's admission refusal: `<resource> "<name>" is forbidden: <why>`, the name being
/// the object's (or its `generateName` before one is generated).
fn forbidden(res: &ResourceDef, obj: &Value, why: &str) -> ApiError {
    let name = match meta::name(obj) {
        "" => meta::generate_name(obj),
        n => n,
    };
    ApiError::forbidden(&res.group_resource(), name, why)
}
