//! The ServiceAccount controller: every active namespace has a ServiceAccount `default`.
//!
//! It reconciles namespaces, and a deleted `default` account wakes its namespace again, so
//! the account is recreated. A namespace being deleted gets none (the server refuses new
//! content there anyway). [`needs_default`] is the decision.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use setpoint_runtime::client::{Api, Client, PostParams};
use setpoint_runtime::controller::{Action, Context, Controller, ReconcileError, Reconciler};
use setpoint_runtime::decision;
use setpoint_runtime::informer::{Scope, SharedInformers, Store};
use setpoint_runtime::ObjectKey;

/// The controller's name (work queue, metrics, logs).
pub const NAME: &str = "serviceaccount";
/// The account every namespace gets.
pub const DEFAULT: &str = "default";

/// Whether a namespace is active: not marked for deletion and not `Terminating`.
pub fn is_active(ns: &Namespace) -> bool {
    ns.metadata.deletion_timestamp.is_none()
        && ns.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Terminating")
}

/// The decision: create `default` in this namespace when it is active and has none.
pub fn needs_default(ns: &Namespace, has_default: bool) -> bool {
    is_active(ns) && !has_default
}

struct ServiceAccountController {
    client: Client,
    namespaces: Store<Namespace>,
    accounts: Store<ServiceAccount>,
}

#[async_trait::async_trait]
impl Reconciler for ServiceAccountController {
    async fn reconcile(&self, ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(ns) = self.namespaces.get(key) else {
            ctx.observe("the namespace is gone");
            return Ok(Action::Done);
        };
        let name = key.name.as_str();
        let existing = self.accounts.get(&ObjectKey::new(Some(name), DEFAULT));
        let has = existing
            .as_ref()
            .is_some_and(|sa| sa.metadata.deletion_timestamp.is_none());
        decision::observe_with(|| {
            let state = if is_active(&ns) {
                "active"
            } else {
                "terminating"
            };
            let account = match &existing {
                None => "no ServiceAccount default",
                Some(_) if !has => "ServiceAccount default being deleted",
                Some(_) => "ServiceAccount default present",
            };
            format!("namespace {name} {state}; {account}")
        });
        if !needs_default(&ns, has) {
            return Ok(Action::Done);
        }
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), name);
        let sa = ServiceAccount {
            metadata: ObjectMeta {
                name: Some(DEFAULT.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        ctx.action(
            "create ServiceAccount default",
            format!("namespace {name} is active and has none"),
        );
        match api.create(&PostParams::default(), &sa).await {
            Ok(_) => {
                tracing::debug!(namespace = %name, "created the default service account");
                Ok(Action::Done)
            }
            // Created meanwhile (the cache had not seen it yet), or the namespace started
            // terminating: either way nothing is left to do.
            Err(e) if e.is_already_exists() || e.code() == Some(403) => {
                ctx.observe(if e.is_already_exists() {
                    "ServiceAccount default exists already (not yet in the cache)"
                } else {
                    "the create was forbidden (403): the namespace is terminating"
                });
                Ok(Action::Done)
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// Builds the ServiceAccount controller.
pub fn controller(client: Client, informers: &SharedInformers) -> Controller {
    let reconciler = ServiceAccountController {
        client,
        namespaces: informers.typed::<Namespace>(Scope::all()).store(),
        accounts: informers.typed::<ServiceAccount>(Scope::all()).store(),
    };
    Controller::for_type::<Namespace>(NAME, informers, None)
        .watches::<ServiceAccount>(None, |sa| {
            match (
                sa.metadata.namespace.as_deref(),
                sa.metadata.name.as_deref(),
            ) {
                (Some(ns), Some(DEFAULT)) => vec![ObjectKey::new(None, ns)],
                _ => vec![],
            }
        })
        .build(Arc::new(reconciler))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ns(v: serde_json::Value) -> Namespace {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn only_active_namespaces_without_one_get_a_default_account() {
        let active = ns(json!({"metadata": {"name": "a"}, "status": {"phase": "Active"}}));
        assert!(needs_default(&active, false));
        assert!(!needs_default(&active, true));
        let terminating =
            ns(json!({"metadata": {"name": "a"}, "status": {"phase": "Terminating"}}));
        assert!(!needs_default(&terminating, false));
        let deleted = ns(json!({"metadata": {"name": "a",
            "deletionTimestamp": "2024-01-01T00:00:00Z"}}));
        assert!(!needs_default(&deleted, false));
    }
}
