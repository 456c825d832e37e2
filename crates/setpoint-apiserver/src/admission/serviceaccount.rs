//! The `ServiceAccount` admission step, as upstream's plugin of that name: a new pod runs as
//! a service account of its namespace (`default` when it names none), which must exist; the
//! account's API credentials are projected into every container at
//! [`TOKEN_MOUNT_PATH`] by a `kube-api-access-<suffix>` volume, unless the pod or the account
//! says `automountServiceAccountToken: false` (the pod's word wins); a pod that names no
//! `imagePullSecrets` gets the account's. Mirror pods (the node's static pods) are left as
//! they are, but may not use service accounts, secrets or projected tokens.
//!
//! Upstream runs it after `LimitRanger` and before `PodSecurity`, `DefaultTolerationSeconds`
//! and `ResourceQuota`; `create` in `objects.rs` calls it in that place. The decisions are
//! the pure functions here; [`ApiServer::admit_service_account`] only finds the account.

use std::time::Duration;

use serde_json::{json, Map, Value};
use setpoint_api::meta;
use setpoint_api::status::ApiError;

use super::noderestriction::MIRROR_POD;
use crate::authorization::node::{pod_references, Referenced};
use crate::registry::ResourceDef;
use crate::state::ApiServer;
use crate::watchcache::decode_object;

/// The account a pod that names none runs as.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";

/// Where containers find their service-account credentials (`token`, `ca.crt`,
/// `namespace`): upstream's `DefaultAPITokenMountPath`.
pub const TOKEN_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The prefix of the projected volume's name; upstream adds five random characters.
pub const VOLUME_NAME_PREFIX: &str = "kube-api-access-";

/// The projected token's requested lifetime: upstream's `WarnOnlyBoundTokenExpirationSeconds`,
/// an hour and seven seconds (a token of exactly this lifetime is recognisable as one a
/// kubelet asked for on an admission-added volume).
pub const TOKEN_EXPIRATION_SECONDS: i64 = 3607;

/// The ConfigMap holding the cluster CA in every namespace.
pub const ROOT_CA_CONFIG_MAP: &str = "kube-root-ca.crt";

/// How many times a missing `default` account is looked up before the pod is refused: the
/// serviceaccount controller creates it moments after its namespace, so a pod created at once
/// waits a little for it (upstream: ten lookups, 100 to 200 ms apart). Any other account is
/// looked up once more, past the cache.
const DEFAULT_ACCOUNT_LOOKUPS: usize = 10;

/// The projected volume upstream's `TokenVolumeSource` describes: the token, the cluster CA
/// and the pod's namespace, files readable by all (420 = 0644).
pub fn token_volume(name: &str) -> Value {
    json!({
        "name": name,
        "projected": {
            "defaultMode": 420,
            "sources": [
                {"serviceAccountToken": {
                    "expirationSeconds": TOKEN_EXPIRATION_SECONDS,
                    "path": "token",
                }},
                {"configMap": {
                    "name": ROOT_CA_CONFIG_MAP,
                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                }},
                {"downwardAPI": {
                    "items": [{
                        "path": "namespace",
                        "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                    }],
                }},
            ],
        },
    })
}

/// The account a pod runs as, after the v1 conversion upstream applies on the way in (the
/// deprecated `serviceAccount` stands in for an empty `serviceAccountName`) and the
/// plugin's default.
pub fn account_name(pod: &Value) -> String {
    let spec = pod.get("spec");
    let field = |f: &str| {
        spec.and_then(|s| s.get(f))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    field("serviceAccountName")
        .or_else(|| field("serviceAccount"))
        .unwrap_or(DEFAULT_SERVICE_ACCOUNT)
        .to_string()
}

/// Whether the account's token is mounted: the pod's `automountServiceAccountToken` when
/// it sets it, else the account's, else yes.
pub fn should_automount(pod: &Value, account: &Value) -> bool {
    let setting = |o: &Value, at: &str| o.pointer(at).and_then(Value::as_bool);
    setting(pod, "/spec/automountServiceAccountToken")
        .or_else(|| setting(account, "/automountServiceAccountToken"))
        .unwrap_or(true)
}

/// Why a mirror pod is refused, in upstream's words, or `None` when it may be created as
/// it is.
pub fn mirror_pod_refusal(pod: &Value) -> Option<&'static str> {
    let spec = pod.get("spec")?;
    if spec
        .get("serviceAccountName")
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty())
    {
        return Some("a mirror pod may not reference service accounts");
    }
    if !pod_references(pod, Referenced::Secret).is_empty() {
        return Some("a mirror pod may not reference secrets");
    }
    let projects_token = spec
        .get("volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.pointer("/projected/sources")?.as_array())
        .flatten()
        .any(|s| s.get("serviceAccountToken").is_some());
    projects_token.then_some("a mirror pod may not use ServiceAccountToken volume projections")
}

/// Whether a pod is a mirror pod (a node's static pod, which the API only reflects).
pub fn is_mirror_pod(pod: &Value) -> bool {
    pod.pointer("/metadata/annotations")
        .and_then(Value::as_object)
        .is_some_and(|a| a.contains_key(MIRROR_POD))
}

/// Everything the step changes on a non-mirror pod, given its (existing) account:
/// the account's name in `serviceAccountName` and its deprecated mirror `serviceAccount`,
/// the token volume and its mounts when the token is automounted, and the account's image
/// pull secrets when the pod names none. `suffix` makes the volume's name when the pod has
/// no `kube-api-access-*` volume yet.
pub fn admit_pod(pod: &mut Value, account: &Value, suffix: impl FnOnce() -> String) {
    let name = account_name(pod);
    let automount = should_automount(pod, account);
    let pull_secrets: Vec<Value> = account
        .get("imagePullSecrets")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|s| s.get("name").and_then(Value::as_str))
        .map(|n| json!({"name": n}))
        .collect();
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    spec.insert("serviceAccountName".into(), Value::from(name.as_str()));
    spec.insert("serviceAccount".into(), Value::from(name));
    if automount {
        mount_token(spec, suffix);
    }
    let names_none = spec
        .get("imagePullSecrets")
        .and_then(Value::as_array)
        .is_none_or(Vec::is_empty);
    if names_none && !pull_secrets.is_empty() {
        spec.insert("imagePullSecrets".into(), Value::Array(pull_secrets));
    }
}

/// Mounts the token volume read-only at [`TOKEN_MOUNT_PATH`] in every init container and
/// container that mounts nothing there already, and adds the volume if one of them needs it
/// and the pod has none (an existing `kube-api-access-*` volume is reused, as upstream).
fn mount_token(spec: &mut Map<String, Value>, suffix: impl FnOnce() -> String) {
    let existing = spec
        .get("volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.get("name").and_then(Value::as_str))
        .find(|n| n.starts_with(VOLUME_NAME_PREFIX))
        .map(str::to_string);
    let volume = existing
        .clone()
        .unwrap_or_else(|| format!("{VOLUME_NAME_PREFIX}{}", suffix()));
    let mount = json!({"name": volume, "readOnly": true, "mountPath": TOKEN_MOUNT_PATH});
    let mut needed = false;
    for field in ["initContainers", "containers"] {
        let containers = spec
            .get_mut(field)
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
            .filter_map(Value::as_object_mut);
        for c in containers {
            let mounts = c
                .entry("volumeMounts")
                .or_insert_with(|| Value::Array(vec![]));
            let Some(mounts) = mounts.as_array_mut() else {
                // A malformed list is left for validation to report.
                continue;
            };
            let taken = mounts
                .iter()
                .any(|m| m.get("mountPath").and_then(Value::as_str) == Some(TOKEN_MOUNT_PATH));
            if !taken {
                mounts.push(mount.clone());
                needed = true;
            }
        }
    }
    if needed && existing.is_none() {
        let volumes = spec
            .entry("volumes")
            .or_insert_with(|| Value::Array(vec![]));
        if let Some(list) = volumes.as_array_mut() {
            list.push(token_volume(&volume));
        }
    }
}

/// upstream's refusal when the account does not exist: `error looking up service account
/// <ns>/<name>: serviceaccount "<name>" not found`.
pub fn missing_account_message(namespace: &str, name: &str) -> String {
    format!(
        "error looking up service account {namespace}/{name}: serviceaccount \"{name}\" not found"
    )
}

/// A 403 about `pod`, named as upstream's admission names it (its name, else its
/// `generateName`).
fn forbidden(res: &ResourceDef, pod: &Value, why: &str) -> ApiError {
    let name = match meta::name(pod) {
        "" => meta::generate_name(pod),
        n => n,
    };
    ApiError::forbidden(&res.group_resource(), name, why)
}

impl ApiServer {
    /// The `ServiceAccount` step on a new pod (a no-op for anything else, or when the server
    /// runs without it): 403 for a mirror pod that uses credentials or a pod whose account
    /// does not exist, else the pod with its account's name, token volume and pull secrets.
    pub(crate) async fn admit_service_account(
        &self,
        res: &ResourceDef,
        namespace: &str,
        pod: &mut Value,
    ) -> Result<(), ApiError> {
        if !self.config.service_account_admission
            || !res.group.is_empty()
            || res.plural != "pods"
            || namespace.is_empty()
        {
            return Ok(());
        }
        if is_mirror_pod(pod) {
            return match mirror_pod_refusal(pod) {
                Some(why) => Err(forbidden(res, pod, why)),
                None => Ok(()),
            };
        }
        let name = account_name(pod);
        let span = tracing::debug_span!("admission.serviceaccount", namespace, account = %name);
        let _entered = span.enter();
        let Some(account) = self.find_service_account(namespace, &name).await? else {
            return Err(forbidden(
                res,
                pod,
                &missing_account_message(namespace, &name),
            ));
        };
        admit_pod(pod, &account, setpoint_api::names::generate_name_suffix);
        Ok(())
    }

    /// The account `namespace/name`: from the watch cache, else (it may be moments old) from
    /// the store, several times over for `default`, which its controller is about to create.
    async fn find_service_account(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Value>, ApiError> {
        let Some(def) = self.registry().get("", "v1", "serviceaccounts").cloned() else {
            return Ok(None);
        };
        let key = def.key(namespace, name);
        if let Some(cached) = self.caches.get(&def.storage_prefix()).get(&key) {
            return Ok(Some(cached.object()));
        }
        let lookups = if name == DEFAULT_SERVICE_ACCOUNT {
            DEFAULT_ACCOUNT_LOOKUPS
        } else {
            1
        };
        for lookup in 0..lookups {
            if lookup > 0 {
                let wait = {
                    use rand::Rng;
                    rand::rng().random_range(100..200)
                };
                tokio::time::sleep(Duration::from_millis(wait)).await;
            }
            let found = self.store.get(&key).await.map_err(|e| {
                ApiError::internal(format!(
                    "error looking up service account {namespace}/{name}: {e}"
                ))
            })?;
            if let Some(kv) = found {
                return Ok(decode_object(&kv.value, kv.mod_revision));
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: Value) -> Value {
        json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": spec})
    }

    fn fixed() -> String {
        "abcde".into()
    }

    #[test]
    fn a_pod_naming_no_account_runs_as_default_with_the_token_in_every_container() {
        let mut p = pod(json!({
            "initContainers": [{"name": "init"}],
            "containers": [{"name": "a", "volumeMounts": [{"name": "d", "mountPath": "/d"}]},
                           {"name": "b"}],
        }));
        admit_pod(&mut p, &json!({}), fixed);
        assert_eq!(p["spec"]["serviceAccountName"], "default");
        assert_eq!(p["spec"]["serviceAccount"], "default");
        let mount = json!({"name": "kube-api-access-abcde", "readOnly": true,
            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"});
        assert_eq!(
            p["spec"]["initContainers"][0]["volumeMounts"],
            json!([mount])
        );
        assert_eq!(
            p["spec"]["containers"][0]["volumeMounts"],
            json!([{"name": "d", "mountPath": "/d"}, mount])
        );
        assert_eq!(p["spec"]["containers"][1]["volumeMounts"], json!([mount]));
        assert_eq!(
            p["spec"]["volumes"],
            json!([{"name": "kube-api-access-abcde", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace",
                    "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
            ]}}])
        );
    }

    #[test]
    fn the_deprecated_field_names_the_account_when_the_new_one_is_empty() {
        let p = pod(json!({"serviceAccount": "legacy", "containers": []}));
        assert_eq!(account_name(&p), "legacy");
        let p = pod(json!({"serviceAccountName": "new", "serviceAccount": "legacy"}));
        assert_eq!(account_name(&p), "new");
        assert_eq!(account_name(&pod(json!({}))), "default");
    }

    #[test]
    fn the_pods_automount_setting_wins_over_the_accounts() {
        let off = json!({"automountServiceAccountToken": false});
        let on = json!({"automountServiceAccountToken": true});
        let none = json!({});
        let p = |v: Option<bool>| match v {
            Some(b) => pod(json!({"automountServiceAccountToken": b})),
            None => pod(json!({})),
        };
        assert!(should_automount(&p(None), &none));
        assert!(!should_automount(&p(None), &off));
        assert!(should_automount(&p(Some(true)), &off));
        assert!(!should_automount(&p(Some(false)), &on));
    }

    #[test]
    fn no_automount_mounts_nothing_but_still_names_the_account() {
        let mut p = pod(json!({"automountServiceAccountToken": false,
            "containers": [{"name": "a"}]}));
        admit_pod(&mut p, &json!({}), fixed);
        assert_eq!(p["spec"]["serviceAccountName"], "default");
        assert!(p["spec"].get("volumes").is_none());
        assert!(p["spec"]["containers"][0].get("volumeMounts").is_none());
    }

    #[test]
    fn a_container_that_mounts_the_path_itself_is_left_alone() {
        let own = json!({"name": "mine", "mountPath": TOKEN_MOUNT_PATH});
        let mut p = pod(json!({
            "volumes": [{"name": "mine", "secret": {"secretName": "s"}}],
            "containers": [{"name": "a", "volumeMounts": [own]}],
        }));
        admit_pod(&mut p, &json!({}), fixed);
        // Nobody needs the token volume, so none is added.
        assert_eq!(p["spec"]["volumes"].as_array().unwrap().len(), 1);
        assert_eq!(p["spec"]["containers"][0]["volumeMounts"], json!([own]));
    }

    #[test]
    fn an_existing_token_volume_is_reused() {
        let mut p = pod(json!({
            "volumes": [{"name": "kube-api-access-zzzzz", "emptyDir": {}}],
            "containers": [{"name": "a"}],
        }));
        admit_pod(&mut p, &json!({}), || unreachable!("no new name is needed"));
        assert_eq!(p["spec"]["volumes"].as_array().unwrap().len(), 1);
        assert_eq!(
            p["spec"]["containers"][0]["volumeMounts"][0]["name"],
            "kube-api-access-zzzzz"
        );
    }

    #[test]
    fn the_accounts_pull_secrets_go_to_a_pod_that_names_none() {
        let account = json!({"imagePullSecrets": [{"name": "reg"}]});
        let mut p = pod(json!({"containers": []}));
        admit_pod(&mut p, &account, fixed);
        assert_eq!(p["spec"]["imagePullSecrets"], json!([{"name": "reg"}]));
        let mut own = pod(json!({"imagePullSecrets": [{"name": "mine"}]}));
        admit_pod(&mut own, &account, fixed);
        assert_eq!(own["spec"]["imagePullSecrets"], json!([{"name": "mine"}]));
    }

    #[test]
    fn mirror_pods_may_not_use_credentials() {
        let mirror = |spec: Value| json!({"metadata": {"name": "m", "annotations": {MIRROR_POD: "x"}}, "spec": spec});
        let plain = mirror(json!({"containers": [{"name": "a"}]}));
        assert!(is_mirror_pod(&plain));
        assert!(!is_mirror_pod(&pod(json!({}))));
        assert_eq!(mirror_pod_refusal(&plain), None);
        assert_eq!(
            mirror_pod_refusal(&mirror(json!({"serviceAccountName": "sa"}))),
            Some("a mirror pod may not reference service accounts")
        );
        assert_eq!(
            mirror_pod_refusal(&mirror(json!({"containers": [{"name": "a",
                "env": [{"name": "P", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}]}))),
            Some("a mirror pod may not reference secrets")
        );
        assert_eq!(
            mirror_pod_refusal(&mirror(
                json!({"volumes": [token_volume("kube-api-access-x")]})
            )),
            Some("a mirror pod may not use ServiceAccountToken volume projections")
        );
    }

    #[test]
    fn a_missing_account_is_refused_in_upstreams_words() {
        assert_eq!(
            missing_account_message("team", "robot"),
            "error looking up service account team/robot: serviceaccount \"robot\" not found"
        );
    }
}
