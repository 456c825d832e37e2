//! The token controller: fills in legacy service-account token Secrets.
//!
//! A Secret of type `kubernetes.io/service-account-token` whose annotation
//! `kubernetes.io/service-account.name` names a ServiceAccount gets `data.token`, `data.ca.crt`
//! (the cluster CA, when the controller knows it) and `data.namespace`, and the annotation
//! `kubernetes.io/service-account.uid`, as kube-controller-manager's tokens controller does.
//! A Secret whose ServiceAccount does not exist (or is another incarnation than the one its
//! uid annotation names) is deleted, as upstream's is.
//!
//! The token is minted through the API (`serviceaccounts/<name>/token`, a TokenRequest bound
//! to the Secret, with the longest validity the API allows, 2^32 seconds) rather than signed
//! here: the signing key stays with the API servers, so a standalone controller manager on
//! another machine needs no copy of it. The API server's authenticator refuses the token once
//! the Secret (or the ServiceAccount) is gone, which is what makes a legacy token revocable.
//!
//! [`plan`] is the pure decision; [`TokenController`] does the I/O around it.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use serde_json::{json, Map, Value};
use setpoint_runtime::client::{Api, Client, DeleteParams, PostParams};
use setpoint_runtime::controller::{Action, Context, Controller, ReconcileError, Reconciler};
use setpoint_runtime::decision;
use setpoint_runtime::informer::{Scope, SharedInformers, Store};
use setpoint_runtime::ObjectKey;

/// The controller's name (work queue, metrics, logs; `--controllers` knows it by this).
pub const NAME: &str = "serviceaccount-token";
/// The Secret type this controller fills in.
pub const SECRET_TYPE: &str = "kubernetes.io/service-account-token";
/// The annotation naming the Secret's ServiceAccount.
pub const NAME_ANNOTATION: &str = "kubernetes.io/service-account.name";
/// The annotation naming the ServiceAccount's uid.
pub const UID_ANNOTATION: &str = "kubernetes.io/service-account.uid";
/// How long the minted tokens are valid: the most a TokenRequest may ask (2^32 seconds, about
/// 136 years), which stands in for upstream's non-expiring legacy tokens.
pub const TOKEN_SECONDS: i64 = 1 << 32;

/// What to do with one token Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Not a token Secret, or nothing is missing.
    Nothing,
    /// Its ServiceAccount is gone or was replaced: delete the Secret.
    Delete,
    /// Fill in what is missing: a token (when `mint`), and this merge patch.
    Fill {
        /// Whether a token has to be minted (it goes into `data.token`).
        mint: bool,
        /// The rest (`data.ca.crt`, `data.namespace`, the uid annotation), as a merge patch.
        patch: Value,
    },
}

/// The ServiceAccount a token Secret names, if it is one this controller fills in (the
/// annotation's value).
pub fn service_account_of(secret: &Secret) -> Option<&str> {
    if secret.type_.as_deref() != Some(SECRET_TYPE) || secret.metadata.deletion_timestamp.is_some()
    {
        return None;
    }
    secret
        .metadata
        .annotations
        .as_ref()?
        .get(NAME_ANNOTATION)
        .map(String::as_str)
        .filter(|n| !n.is_empty())
}

/// The pure decision for a token Secret whose ServiceAccount has `account_uid` (`None` when
/// it does not exist), given the cluster CA to publish (if known).
pub fn plan(secret: &Secret, account_uid: Option<&str>, root_ca: Option<&str>) -> Plan {
    if service_account_of(secret).is_none() {
        return Plan::Nothing;
    }
    let Some(account_uid) = account_uid else {
        return Plan::Delete;
    };
    let annotations = secret.metadata.annotations.clone().unwrap_or_default();
    match annotations.get(UID_ANNOTATION) {
        Some(uid) if !uid.is_empty() && uid != account_uid => return Plan::Delete,
        _ => {}
    }
    let empty = BTreeMap::new();
    let data = secret.data.as_ref().unwrap_or(&empty);
    let has = |key: &str, want: &[u8]| data.get(key).is_some_and(|v| v.0 == want);
    let namespace = secret.metadata.namespace.clone().unwrap_or_default();
    let mut patch_data = Map::new();
    if let Some(ca) = root_ca {
        if !has("ca.crt", ca.as_bytes()) {
            patch_data.insert("ca.crt".into(), json!(base64(ca.as_bytes())));
        }
    }
    if !has("namespace", namespace.as_bytes()) {
        patch_data.insert("namespace".into(), json!(base64(namespace.as_bytes())));
    }
    let mint = data.get("token").is_none_or(|t| t.0.is_empty());
    let uid_missing = annotations.get(UID_ANNOTATION).is_none_or(String::is_empty);
    if !mint && patch_data.is_empty() && !uid_missing {
        return Plan::Nothing;
    }
    let mut patch = json!({"metadata": {"annotations": {UID_ANNOTATION: account_uid}}});
    if !patch_data.is_empty() {
        patch["data"] = Value::Object(patch_data);
    }
    Plan::Fill { mint, patch }
}

/// `secret` with a [`Plan::Fill`] patch merged in (its annotations and data keys set; its
/// `resourceVersion` kept, so the update is a compare-and-swap).
pub fn filled(secret: &Secret, patch: &Value) -> Result<Secret, serde_json::Error> {
    let mut obj = serde_json::to_value(secret)?;
    for (section, path) in [("annotations", "/metadata/annotations"), ("data", "/data")] {
        let Some(Value::Object(entries)) = patch.pointer(path) else {
            continue;
        };
        let target = if section == "data" {
            &mut obj["data"]
        } else {
            &mut obj["metadata"]["annotations"]
        };
        if !target.is_object() {
            *target = json!({});
        }
        for (k, v) in entries {
            target[k.as_str()] = v.clone();
        }
    }
    serde_json::from_value(obj)
}

/// What a [`Plan::Fill`] fills in, by name (never the values), for the decision record.
fn fill_summary(secret: &Secret, mint: bool, patch: &Value) -> String {
    let mut out: Vec<&str> = Vec::new();
    if mint {
        out.push("token");
    }
    if let Some(Value::Object(data)) = patch.get("data") {
        out.extend(data.keys().map(String::as_str));
    }
    let uid_missing = secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(UID_ANNOTATION))
        .is_none_or(String::is_empty);
    if uid_missing {
        out.push("the uid annotation");
    }
    out.join(", ")
}

fn base64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The I/O around [`plan`].
pub struct TokenController {
    client: Client,
    secrets: Store<Secret>,
    accounts: Store<ServiceAccount>,
    root_ca: Option<String>,
}

impl TokenController {
    /// The uid of the ServiceAccount `ns`/`name`: from the cache, else from the API (a Secret
    /// created right after its account may be seen before the account is).
    async fn account_uid(&self, ns: &str, name: &str) -> Result<Option<String>, ReconcileError> {
        let key = ObjectKey::new(Some(ns), name);
        if let Some(sa) = self.accounts.get(&key) {
            return Ok(sa.metadata.uid.clone());
        }
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), ns);
        let live = api.get_opt(name).await.map_err(ReconcileError::from)?;
        Ok(live.and_then(|sa| sa.metadata.uid))
    }

    /// A token bound to the Secret, minted by the API server.
    async fn mint(
        &self,
        ns: &str,
        account: &str,
        secret: &Secret,
    ) -> Result<String, ReconcileError> {
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), ns);
        let request = json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": TOKEN_SECONDS,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "name": secret.metadata.name.clone().unwrap_or_default(),
                    "uid": secret.metadata.uid.clone().unwrap_or_default(),
                },
            },
        });
        let answer = api
            .create_subresource(account, "token", &request)
            .await
            .map_err(ReconcileError::from)?;
        answer
            .pointer("/status/token")
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| ReconcileError::retry("the TokenRequest answer has no token"))
    }
}

#[async_trait::async_trait]
impl Reconciler for TokenController {
    async fn reconcile(&self, ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(secret) = self.secrets.get(key) else {
            ctx.observe("the Secret is gone");
            return Ok(Action::Done);
        };
        let Some(account) = service_account_of(&secret).map(str::to_string) else {
            ctx.observe("not a service-account token Secret naming an account, or being deleted");
            return Ok(Action::Done);
        };
        let ns = key.namespace.clone().unwrap_or_default();
        let uid = self.account_uid(&ns, &account).await?;
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &ns);
        let decided = plan(&secret, uid.as_deref(), self.root_ca.as_deref());
        decision::observe_with(|| match &uid {
            Some(uid) => format!("token Secret of ServiceAccount {account} (uid {uid})"),
            None => format!("token Secret of ServiceAccount {account}, which does not exist"),
        });
        match decided {
            Plan::Nothing => {
                ctx.observe("token, ca.crt, namespace and the uid annotation are filled in");
                Ok(Action::Done)
            }
            Plan::Delete => {
                ctx.action(
                    format!("delete Secret {}", key.name),
                    match &uid {
                        None => format!("its ServiceAccount {account} does not exist"),
                        Some(_) => format!(
                            "its {UID_ANNOTATION} annotation names another incarnation of ServiceAccount {account}"
                        ),
                    },
                );
                let params = DeleteParams {
                    precondition_uid: secret.metadata.uid.clone(),
                    ..Default::default()
                };
                match api.delete(&key.name, &params).await {
                    Ok(_) => {
                        tracing::info!(namespace = %ns, secret = %key.name, serviceaccount = %account,
                            "deleted a token secret whose service account is gone");
                        Ok(Action::Done)
                    }
                    Err(e) if e.is_not_found() || e.is_conflict() => Ok(Action::Done),
                    Err(e) => Err(e.into()),
                }
            }
            Plan::Fill { mint, mut patch } => {
                let recording = ctx.recording();
                let missing = if recording {
                    fill_summary(&secret, mint, &patch)
                } else {
                    String::new()
                };
                if recording {
                    ctx.observe(format!("missing or stale: {missing}"));
                }
                if mint {
                    ctx.action(
                        format!("create serviceaccounts/{account}/token (bound to the Secret)"),
                        "the Secret has no token",
                    );
                    let token = self.mint(&ns, &account, &secret).await?;
                    patch["data"]["token"] = json!(base64(token.as_bytes()));
                }
                // An update (what upstream's controller role may do), over the version the
                // decision was made on, so two passes never leave two different tokens behind.
                let filled = filled(&secret, &patch)
                    .map_err(|e| ReconcileError::terminal(format!("filling the secret: {e}")))?;
                if recording {
                    ctx.action(
                        format!("update Secret {} (fill in {missing})", key.name),
                        "its ServiceAccount exists, and these are missing or stale",
                    );
                }
                match api
                    .replace(&key.name, &PostParams::default(), &filled)
                    .await
                {
                    Ok(_) => Ok(Action::Done),
                    // Changed meanwhile: the informer's next event brings it back.
                    Err(e) if e.is_conflict() || e.is_not_found() => Ok(Action::Done),
                    Err(e) => Err(e.into()),
                }
            }
        }
    }
}

/// Builds the token controller; `root_ca` is the PEM published as `ca.crt`.
pub fn controller(
    client: Client,
    informers: &SharedInformers,
    root_ca: Option<String>,
) -> Controller {
    let secrets = informers.typed::<Secret>(Scope::all()).store();
    let reconciler = TokenController {
        client,
        secrets: secrets.clone(),
        accounts: informers.typed::<ServiceAccount>(Scope::all()).store(),
        root_ca,
    };
    Controller::for_type::<Secret>(NAME, informers, None)
        // A recreated account: the token Secrets naming it are looked at again (those of the
        // old incarnation go).
        .watches::<ServiceAccount>(None, move |sa: &ServiceAccount| {
            let ns = sa.metadata.namespace.clone().unwrap_or_default();
            let name = sa.metadata.name.clone().unwrap_or_default();
            secrets
                .by_namespace(&ns)
                .iter()
                .filter(|s| service_account_of(s) == Some(name.as_str()))
                .map(|s| ObjectKey::new(Some(&ns), s.metadata.name.as_deref().unwrap_or("")))
                .collect()
        })
        .build(Arc::new(reconciler))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use k8s_openapi::ByteString;

    fn secret(annotations: &[(&str, &str)], data: &[(&str, &str)]) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some("s".into()),
                namespace: Some("a".into()),
                uid: Some("secret-uid".into()),
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            type_: Some(SECRET_TYPE.into()),
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn a_new_token_secret_is_filled_in() {
        let s = secret(&[(NAME_ANNOTATION, "bot")], &[]);
        let Plan::Fill { mint, patch } = plan(&s, Some("sa-uid"), Some("CA")) else {
            panic!("a fill")
        };
        assert!(mint);
        assert_eq!(patch["metadata"]["annotations"][UID_ANNOTATION], "sa-uid");
        assert_eq!(patch["data"]["ca.crt"], base64(b"CA"));
        assert_eq!(patch["data"]["namespace"], base64(b"a"));
    }

    #[test]
    fn a_fill_keeps_the_rest_of_the_secret() {
        let mut s = secret(&[(NAME_ANNOTATION, "bot")], &[("other", "x")]);
        s.metadata.resource_version = Some("7".into());
        let Plan::Fill { mut patch, .. } = plan(&s, Some("sa-uid"), Some("CA")) else {
            panic!("a fill")
        };
        patch["data"]["token"] = json!(base64(b"t"));
        let f = filled(&s, &patch).unwrap();
        assert_eq!(f.metadata.resource_version.as_deref(), Some("7"));
        let annotations = f.metadata.annotations.unwrap();
        assert_eq!(annotations[NAME_ANNOTATION], "bot");
        assert_eq!(annotations[UID_ANNOTATION], "sa-uid");
        let data = f.data.unwrap();
        assert_eq!(data["token"].0, b"t");
        assert_eq!(data["ca.crt"].0, b"CA");
        assert_eq!(data["other"].0, b"x");
        // A secret without data or annotations at all.
        let mut bare = secret(&[], &[]);
        bare.data = None;
        bare.metadata.annotations = None;
        let f = filled(&bare, &patch).unwrap();
        assert_eq!(f.data.unwrap()["namespace"].0, b"a");
    }

    #[test]
    fn a_complete_secret_is_left_alone() {
        let s = secret(
            &[(NAME_ANNOTATION, "bot"), (UID_ANNOTATION, "sa-uid")],
            &[("token", "t"), ("ca.crt", "CA"), ("namespace", "a")],
        );
        assert_eq!(plan(&s, Some("sa-uid"), Some("CA")), Plan::Nothing);
        // A new CA is published without a new token.
        let Plan::Fill { mint, patch } = plan(&s, Some("sa-uid"), Some("CA2")) else {
            panic!("a fill")
        };
        assert!(!mint);
        assert_eq!(patch["data"]["ca.crt"], base64(b"CA2"));
    }

    #[test]
    fn a_secret_of_a_missing_or_replaced_account_is_deleted() {
        let s = secret(&[(NAME_ANNOTATION, "bot")], &[]);
        assert_eq!(plan(&s, None, None), Plan::Delete);
        let s = secret(&[(NAME_ANNOTATION, "bot"), (UID_ANNOTATION, "old")], &[]);
        assert_eq!(plan(&s, Some("new"), None), Plan::Delete);
    }

    #[test]
    fn other_secrets_are_not_this_controllers() {
        let mut s = secret(&[(NAME_ANNOTATION, "bot")], &[]);
        s.type_ = Some("Opaque".into());
        assert_eq!(plan(&s, None, None), Plan::Nothing);
        let s = secret(&[], &[]);
        assert_eq!(plan(&s, None, None), Plan::Nothing);
    }
}
