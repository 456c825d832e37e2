//! The API server's loop over ValidatingAdmissionPolicies: each policy's `status` says which
//! generation was last looked at (`observedGeneration`) and, in
//! `typeChecking.expressionWarnings`, which of its expressions do not compile or do not
//! type-check against the schemas of the kinds it matches (as upstream's type-checking
//! controller reports them).
//!
//! Level-triggered like the CRD loop: every pass looks at all policies in the watch cache
//! and writes a status only when it differs from what the pass computes.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::{compiled, GROUP, POLICIES};
use crate::cel::schema::Node;
use crate::objects::WriteOptions;
use crate::openapi::{self, KindSchema};
use crate::registry::Registry;
use crate::state::ApiServer;
use crate::strategy::View;
use crate::watchcache::{Filter, WatchStart};

/// The field manager the status writes are recorded under.
const MANAGER: &str = "validatingadmissionpolicy-status-controller";
/// How long to wait before watching again after the watch could not start.
const RETRY: Duration = Duration::from_millis(500);

/// The status the server keeps for `policy`: what it reports now, with its conditions kept.
/// Expressions are type-checked against the schemas `registry`'s OpenAPI documents publish for
/// the kinds the policy matches and for its `paramKind`.
pub fn desired_status(policy: &Value, registry: &Registry) -> Value {
    let mut status = policy.get("status").cloned().unwrap_or_else(|| json!({}));
    if !status.is_object() {
        status = json!({});
    }
    let generation = policy
        .pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    status["observedGeneration"] = json!(generation);
    let compiled = compiled::compiled(policy);
    let kinds: Vec<KindSchema> = compiled
        .matched_resources()
        .iter()
        .filter_map(|(g, v, r)| openapi::kind_schema(registry, g, v, r, false))
        .collect();
    let nodes: Vec<(&str, Node<'_>)> = kinds
        .iter()
        .filter_map(|k| Some((k.gvk.as_str(), k.node()?)))
        .collect();
    let param_kind = compiled
        .param_kind
        .as_ref()
        .and_then(|(api_version, kind)| {
            let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
            openapi::kind_schema(registry, group, version, kind, true)
        });
    let unknown = json!({});
    let params = param_kind
        .as_ref()
        .and_then(KindSchema::node)
        .unwrap_or(Node::new(&unknown));
    let warnings = compiled.expression_warnings(&nodes, params);
    status["typeChecking"] = if warnings.is_empty() {
        json!({})
    } else {
        json!({"expressionWarnings": warnings})
    };
    status
}

impl ApiServer {
    /// Writes every policy's status that differs from [`desired_status`].
    async fn sync_policy_statuses(&self) {
        let Some(res) = self.registry().get(GROUP, "v1", POLICIES).cloned() else {
            return;
        };
        let (cached, _) = self
            .caches
            .get(&res.storage_prefix())
            .list(&res.namespace_prefix(None), &Filter::all());
        let opts = WriteOptions {
            field_manager: Some(MANAGER.into()),
            ..WriteOptions::default()
        };
        let registry = self.registry();
        for o in cached {
            let policy = o.object();
            let desired = desired_status(&policy, &registry);
            if policy.get("status") == Some(&desired) {
                continue;
            }
            let name = setpoint_api::meta::name(&policy).to_string();
            let patch = crate::patch::Patch::Merge(json!({"status": desired}));
            if let Err(e) = self
                .patch(&res, "", &name, View::Status, &patch, &opts)
                .await
            {
                if e.code != 404 && e.code != 409 {
                    tracing::warn!(policy = %name, error = %e.message, "writing admission policy status");
                }
            }
        }
    }

    /// Keeps policies' statuses current until the server stops.
    pub(crate) async fn policy_status_loop(self: Arc<Self>) {
        let Some(res) = self.registry().get(GROUP, "v1", POLICIES).cloned() else {
            return;
        };
        let mut stopping = self.stopping_signal();
        loop {
            let cache = self.caches.get(&res.storage_prefix());
            let mut handle = match cache.watch(WatchStart::CurrentState, Filter::all(), false) {
                Ok(h) => h,
                Err(e) => {
                    tracing::warn!(error = %e.message, "watching admission policies");
                    tokio::select! {
                        _ = tokio::time::sleep(RETRY) => continue,
                        _ = crate::crd::controller::stopped(&mut stopping) => return,
                    }
                }
            };
            self.sync_policy_statuses().await;
            loop {
                tokio::select! {
                    item = handle.next_live() => {
                        if item.is_none() {
                            break;
                        }
                        // One pass covers every event queued so far.
                        while handle.try_next_live().is_some() {}
                        self.sync_policy_statuses().await;
                    }
                    _ = crate::crd::controller::stopped(&mut stopping) => return,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_reports_the_generation_and_expressions_that_do_not_compile() {
        let policy = json!({
            "metadata": {"name": "p", "uid": "status-test-uid", "generation": 3},
            "spec": {"validations": [
                {"expression": "object.spec.replicas <= 5"},
                {"expression": "object.spec.replicas <=", "messageExpression": "'x' +"}
            ]}
        });
        let s = desired_status(&policy, &Registry::builtin());
        assert_eq!(s["observedGeneration"], 3);
        let warnings = s["typeChecking"]["expressionWarnings"].as_array().unwrap();
        assert_eq!(warnings.len(), 2, "{s}");
        assert_eq!(warnings[0]["fieldRef"], "spec.validations[1].expression");
        assert_eq!(
            warnings[1]["fieldRef"],
            "spec.validations[1].messageExpression"
        );
        assert!(warnings[0]["warning"]
            .as_str()
            .unwrap()
            .starts_with("compilation failed: "));
    }

    #[test]
    fn status_reports_type_errors_against_the_matched_kinds_schema() {
        let policy = |uid: &str, expression: &str| {
            json!({
                "metadata": {"name": "p", "uid": uid, "generation": 1},
                "spec": {
                    "matchConstraints": {"resourceRules": [{
                        "apiGroups": ["apps"], "apiVersions": ["v1"],
                        "operations": ["CREATE"], "resources": ["deployments"]
                    }]},
                    "validations": [{"expression": expression}]
                }
            })
        };
        let registry = Registry::builtin();
        let wrong = desired_status(
            &policy("typecheck-wrong", "object.spec.replicsa <= 5"),
            &registry,
        );
        let warnings = wrong["typeChecking"]["expressionWarnings"]
            .as_array()
            .unwrap_or_else(|| panic!("no warnings: {wrong}"));
        assert_eq!(warnings.len(), 1, "{wrong}");
        assert_eq!(warnings[0]["fieldRef"], "spec.validations[0].expression");
        let text = warnings[0]["warning"].as_str().unwrap();
        assert!(
            text.starts_with(
                "apps/v1, Kind=Deployment: ERROR: <input>:1:12: undefined field 'replicsa'"
            ),
            "{text}"
        );
        let right = desired_status(
            &policy("typecheck-right", "object.spec.replicas <= 5"),
            &registry,
        );
        assert_eq!(right["typeChecking"], json!({}), "{right}");
    }
}
