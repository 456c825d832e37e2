//! The root CA publisher: every namespace has the ConfigMap `kube-root-ca.crt` whose
//! `ca.crt` is the cluster CA's certificate (PEM), so pods can verify the API server.
//!
//! A changed or deleted ConfigMap wakes its namespace, and the publisher writes it back.
//! It needs the CA: `setpoint up` passes the API server's, a standalone controller manager
//! its kubeconfig's `certificate-authority-data`; without one (plain HTTP) it does not run.
//! [`desired`] is the decision.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use setpoint_runtime::client::{Api, Client, PostParams};
use setpoint_runtime::controller::{Action, Context, Controller, ReconcileError, Reconciler};
use setpoint_runtime::decision;
use setpoint_runtime::informer::{Scope, SharedInformers, Store};
use setpoint_runtime::ObjectKey;

/// The controller's name (work queue, metrics, logs).
pub const NAME: &str = "root-ca-cert-publisher";
/// The ConfigMap published in every namespace.
pub const CONFIG_MAP: &str = "kube-root-ca.crt";
/// The key of the certificate in its data.
pub const KEY: &str = "ca.crt";
/// The annotation that says what the ConfigMap is for.
pub const DESCRIPTION_ANNOTATION: &str = "kubernetes.io/description";
/// Upstream's description.
pub const DESCRIPTION: &str = "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters.";

/// The decision: the ConfigMap to write, or `None` when `current` is already right. The
/// data is exactly the CA; other annotations and labels are kept.
pub fn desired(current: Option<&ConfigMap>, ca_pem: &str) -> Option<ConfigMap> {
    let want_data = BTreeMap::from([(KEY.to_string(), ca_pem.to_string())]);
    match current {
        None => Some(ConfigMap {
            metadata: ObjectMeta {
                name: Some(CONFIG_MAP.into()),
                annotations: Some(BTreeMap::from([(
                    DESCRIPTION_ANNOTATION.to_string(),
                    DESCRIPTION.to_string(),
                )])),
                ..Default::default()
            },
            data: Some(want_data),
            ..Default::default()
        }),
        Some(cm) => {
            let described = is_described(cm);
            let data_ok = cm.data.as_ref() == Some(&want_data)
                && cm.binary_data.as_ref().is_none_or(|b| b.is_empty());
            if described && data_ok {
                return None;
            }
            let mut cm = cm.clone();
            cm.metadata.managed_fields = None;
            cm.metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(DESCRIPTION_ANNOTATION.into(), DESCRIPTION.into());
            cm.data = Some(want_data);
            cm.binary_data = None;
            Some(cm)
        }
    }
}

/// Whether `cm` carries upstream's description annotation.
fn is_described(cm: &ConfigMap) -> bool {
    cm.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DESCRIPTION_ANNOTATION))
        .is_some_and(|d| d == DESCRIPTION)
}

/// What the decision sees in `current`, for the decision record (never the certificate).
fn describe(current: Option<&ConfigMap>, ca_pem: &str) -> String {
    let Some(cm) = current else {
        return format!("no ConfigMap {CONFIG_MAP}");
    };
    let mut differs = Vec::new();
    let data = cm.data.as_ref();
    if data.and_then(|d| d.get(KEY)).map(String::as_str) != Some(ca_pem) {
        differs.push(format!("{KEY} is not the cluster CA"));
    }
    let others = data.map_or(0, |d| d.keys().filter(|k| *k != KEY).count())
        + cm.binary_data.as_ref().map_or(0, |b| b.len());
    if others > 0 {
        differs.push(format!("{others} other data key(s)"));
    }
    if !is_described(cm) {
        differs.push(format!("the {DESCRIPTION_ANNOTATION} annotation differs"));
    }
    if differs.is_empty() {
        format!("ConfigMap {CONFIG_MAP} is up to date")
    } else {
        format!("ConfigMap {CONFIG_MAP}: {}", differs.join(", "))
    }
}

struct Publisher {
    client: Client,
    ca_pem: String,
    namespaces: Store<Namespace>,
    config_maps: Store<ConfigMap>,
}

#[async_trait::async_trait]
impl Reconciler for Publisher {
    async fn reconcile(&self, ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(ns) = self.namespaces.get(key) else {
            ctx.observe("the namespace is gone");
            return Ok(Action::Done);
        };
        if !crate::serviceaccount::is_active(&ns) {
            ctx.observe("the namespace is terminating");
            return Ok(Action::Done);
        }
        let name = key.name.as_str();
        let current = self
            .config_maps
            .get(&ObjectKey::new(Some(name), CONFIG_MAP));
        decision::observe_with(|| describe(current.as_deref(), &self.ca_pem));
        let Some(want) = desired(current.as_deref(), &self.ca_pem) else {
            return Ok(Action::Done);
        };
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), name);
        if current.is_some() {
            ctx.action(
                format!("update ConfigMap {CONFIG_MAP}"),
                "its data is not exactly ca.crt = the cluster CA, or its description differs",
            );
        } else {
            ctx.action(
                format!("create ConfigMap {CONFIG_MAP}"),
                format!("namespace {name} is active and has none"),
            );
        }
        let result = if current.is_some() {
            // Carries the cached resourceVersion: a concurrent change gives 409 and a retry
            // against the newer version.
            api.replace(CONFIG_MAP, &PostParams::default(), &want)
                .await
                .map(|_| ())
        } else {
            api.create(&PostParams::default(), &want).await.map(|_| ())
        };
        match result {
            Ok(()) => Ok(Action::Done),
            Err(e)
                if e.code() == Some(403)
                    && !self
                        .namespaces
                        .get(key)
                        .is_some_and(|n| crate::serviceaccount::is_active(&n)) =>
            {
                ctx.observe("the write was forbidden (403): the namespace is terminating");
                Ok(Action::Done)
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// Builds the root CA publisher for the cluster CA `ca_pem`.
pub fn controller(client: Client, informers: &SharedInformers, ca_pem: String) -> Controller {
    let reconciler = Publisher {
        client,
        ca_pem,
        namespaces: informers.typed::<Namespace>(Scope::all()).store(),
        config_maps: informers.typed::<ConfigMap>(Scope::all()).store(),
    };
    Controller::for_type::<Namespace>(NAME, informers, None)
        .watches::<ConfigMap>(None, |cm| {
            match (
                cm.metadata.namespace.as_deref(),
                cm.metadata.name.as_deref(),
            ) {
                (Some(ns), Some(CONFIG_MAP)) => vec![ObjectKey::new(None, ns)],
                _ => vec![],
            }
        })
        .build(Arc::new(reconciler))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEM: &str = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";

    #[test]
    fn missing_or_changed_config_maps_are_written_back() {
        let created = desired(None, PEM).unwrap();
        assert_eq!(created.metadata.name.as_deref(), Some(CONFIG_MAP));
        assert_eq!(created.data.as_ref().unwrap()[KEY], PEM);
        assert_eq!(
            created.metadata.annotations.as_ref().unwrap()[DESCRIPTION_ANNOTATION],
            DESCRIPTION
        );
        // Already right: nothing to write.
        assert!(desired(Some(&created), PEM).is_none());
        // Tampered data is replaced; a user's extra annotation is kept.
        let mut changed = created.clone();
        changed.data = Some(BTreeMap::from([
            (KEY.into(), "other".into()),
            ("extra".into(), "x".into()),
        ]));
        changed
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert("team".into(), "a".into());
        let fixed = desired(Some(&changed), PEM).unwrap();
        assert_eq!(fixed.data, created.data);
        assert_eq!(fixed.metadata.annotations.as_ref().unwrap()["team"], "a");
        // A new CA is published.
        assert!(desired(Some(&created), "another").is_some());
        // What the records say, without the certificate.
        assert_eq!(describe(None, PEM), "no ConfigMap kube-root-ca.crt");
        assert_eq!(
            describe(Some(&created), PEM),
            "ConfigMap kube-root-ca.crt is up to date"
        );
        assert_eq!(
            describe(Some(&changed), PEM),
            "ConfigMap kube-root-ca.crt: ca.crt is not the cluster CA, 1 other data key(s)"
        );
    }
}
