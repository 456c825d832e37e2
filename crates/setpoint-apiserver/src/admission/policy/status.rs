//! The API server's loop over ValidatingAdmissionPolicies: each policy's `status` says which
//! generation was last looked at (`observedGeneration`) and, in
//! `typeChecking.expressionWarnings`, which of its expressions do not compile (upstream's
//! type-checking controller puts type errors there; here it is what the compiler reports).
//!
//! Level-triggered like the CRD loop: every pass looks at all policies in the watch cache
//! and writes a status only when it differs from what the pass computes.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::{compiled, GROUP, POLICIES};
use crate::objects::WriteOptions;
use crate::state::ApiServer;
use crate::strategy::View;
use crate::watchcache::{Filter, WatchStart};

/// The field manager the status writes are recorded under.
const MANAGER: &str = "validatingadmissionpolicy-status-controller";
/// How long to wait before watching again after the watch could not start.
const RETRY: Duration = Duration::from_millis(500);

/// The status the server keeps for `policy`: what it reports now, with its conditions kept.
pub fn desired_status(policy: &Value) -> Value {
    let mut status = policy.get("status").cloned().unwrap_or_else(|| json!({}));
    if !status.is_object() {
        status = json!({});
    }
    let generation = policy
        .pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    status["observedGeneration"] = json!(generation);
    let warnings = compiled::compiled(policy).expression_warnings();
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
        for o in cached {
            let policy = o.object();
            let desired = desired_status(&policy);
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
        let s = desired_status(&policy);
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
}
