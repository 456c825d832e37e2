//! `pods/<name>/eviction`: a delete that respects PodDisruptionBudgets, as upstream's eviction
//! REST does.
//!
//! A pod that is already disrupted (Pending, terminal or terminating) is deleted at once. Else
//! the budgets whose selector matches it are found: more than one is refused with 500; with
//! one, an unready pod may go without using the budget when its policy allows, and otherwise
//! the budget must allow a disruption, which the eviction uses by a compare-and-swap on the
//! budget's status (decrementing `disruptionsAllowed` and recording the pod in
//! `disruptedPods`), so two evictions racing for the last disruption cannot both pass. Then
//! the pod is deleted with the Eviction's `deleteOptions` — after its status gains the
//! `DisruptionTarget` condition (reason `EvictionByEvictionAPI`), as upstream's does, so a
//! Job's `podFailurePolicy` can tell an eviction from a failure.

use serde_json::{json, Value};
use setpoint_api::disruption::{
    budget_message, eviction_guards, is_pod_ready, update_disruption_allowed_condition,
    ALWAYS_ALLOW, DISRUPTION_BUDGET_CAUSE, EVICTION_REFUSED, MAX_DISRUPTED_PODS,
};
use setpoint_api::resource::GroupResource;
use setpoint_api::{meta, ApiError, Cause};

use crate::objects::{DeleteOptions, WriteOptions};
use crate::state::ApiServer;
use crate::strategy::View;
use crate::watchcache::Filter;

/// How many times a write conflicting with another is retried (upstream's `EvictionsRetry`
/// steps).
const RETRIES: usize = 5;

/// What an eviction answers when it succeeds or is refused without an error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Evicted {
    /// The pod was deleted (or would be, for a dry run).
    Deleted,
    /// The pod is guarded by more than one budget, which the eviction subresource does not
    /// support: upstream answers a `Status` of code 500 without a reason.
    TooManyBudgets,
}

/// The message of [`Evicted::TooManyBudgets`].
pub const TOO_MANY_BUDGETS: &str =
    "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.";

/// The reason of the `DisruptionTarget` condition an eviction gives the pod.
pub const DISRUPTION_REASON: &str = "EvictionByEvictionAPI";
/// The message of that condition.
pub const DISRUPTION_MESSAGE: &str = "Eviction API: evicting";

/// `pod` with the `DisruptionTarget` condition set True as upstream's eviction sets it
/// (`lastTransitionTime` kept when the status does not change), or `None` when it has it
/// already.
pub fn with_disruption_target(pod: &Value, now: &str) -> Option<Value> {
    let mut out = pod.clone();
    let status = out
        .as_object_mut()?
        .entry("status")
        .or_insert_with(|| json!({}));
    let conditions = status
        .as_object_mut()?
        .entry("conditions")
        .or_insert_with(|| json!([]));
    if !conditions.is_array() {
        *conditions = json!([]);
    }
    let list = conditions.as_array_mut()?;
    let fresh = json!({
        "type": "DisruptionTarget",
        "status": "True",
        "reason": DISRUPTION_REASON,
        "message": DISRUPTION_MESSAGE,
        "lastTransitionTime": now,
    });
    let same = |c: &Value, k: &str| c.get(k) == fresh.get(k);
    match list
        .iter_mut()
        .find(|c| c.get("type").and_then(Value::as_str) == Some("DisruptionTarget"))
    {
        Some(c) if same(c, "status") && same(c, "reason") && same(c, "message") => None,
        Some(c) => {
            let since = same(c, "status").then(|| c.get("lastTransitionTime").cloned());
            *c = fresh;
            if let Some(Some(t)) = since {
                c["lastTransitionTime"] = t;
            }
            Some(out)
        }
        None => {
            list.push(fresh);
            Some(out)
        }
    }
}

/// How an eviction treats a pod, decided from the pod and the budgets guarding it.
#[derive(Clone, Debug, PartialEq)]
pub enum Plan {
    /// Delete without consulting budgets (upstream's `canIgnorePDB`); `precondition` pins
    /// the pod's resourceVersion unless it is terminal.
    Delete { precondition: bool },
    /// More than one budget guards the pod.
    TooManyBudgets,
    /// No budget guards the pod: delete it.
    Unguarded,
    /// An unready pod the budget lets go without using a disruption; the delete pins the
    /// pod's resourceVersion, so a pod that became ready meanwhile is not deleted.
    UnhealthyDelete { budget: String },
    /// The budget must allow a disruption, which the eviction uses.
    UseBudget { budget: String },
}

/// Phase of a pod, empty when unset.
fn phase(pod: &Value) -> &str {
    pod.pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// Decides how to evict `pod`, given the budgets of its namespace.
pub fn plan(pod: &Value, budgets: &[Value]) -> Plan {
    let phase = phase(pod);
    if matches!(phase, "Succeeded" | "Failed" | "Pending")
        || meta::deletion_timestamp(pod).is_some()
    {
        return Plan::Delete {
            precondition: !matches!(phase, "Succeeded" | "Failed"),
        };
    }
    let guarding: Vec<&Value> = budgets.iter().filter(|b| eviction_guards(b, pod)).collect();
    let budget = match guarding.as_slice() {
        [] => return Plan::Unguarded,
        [one] => *one,
        _ => return Plan::TooManyBudgets,
    };
    let name = meta::name(budget).to_string();
    if !is_pod_ready(pod) {
        let policy = budget
            .pointer("/spec/unhealthyPodEvictionPolicy")
            .and_then(Value::as_str);
        if policy == Some(ALWAYS_ALLOW) {
            return Plan::UnhealthyDelete { budget: name };
        }
        let status = |f: &str| {
            budget
                .pointer(&format!("/status/{f}"))
                .and_then(Value::as_i64)
                .unwrap_or(0)
        };
        // The application is not disrupted: deleting a pod that does not count as healthy
        // will not disrupt it.
        if status("currentHealthy") >= status("desiredHealthy") && status("desiredHealthy") > 0 {
            return Plan::UnhealthyDelete { budget: name };
        }
    }
    Plan::UseBudget { budget: name }
}

fn pdb_resource() -> GroupResource {
    GroupResource {
        group: "policy".into(),
        resource: "poddisruptionbudget".into(),
    }
}

/// 429 with upstream's message and one `DisruptionBudget` cause.
fn refused(cause: String) -> ApiError {
    let mut e = ApiError::too_many_requests(EVICTION_REFUSED, 0);
    if let Some(d) = e.details.as_mut() {
        // Upstream's retryAfterSeconds is 0, which its Status omits.
        d.retry_after_seconds = None;
        d.causes
            .push(Cause::new(DISRUPTION_BUDGET_CAUSE, "", cause));
    }
    e
}

/// Upstream's `checkAndDecrement`: the budget with one disruption used by `pod`, or why the
/// eviction is refused. `now` is recorded as the disruption's time.
pub fn check_and_decrement(pdb: &Value, pod: &str, now: &str) -> Result<Value, ApiError> {
    let name = meta::name(pdb);
    let status = |f: &str| {
        pdb.pointer(&format!("/status/{f}"))
            .and_then(Value::as_i64)
            .unwrap_or(0)
    };
    if status("observedGeneration") < meta::generation(pdb) {
        return Err(refused(format!(
            "The disruption budget {name} is still being processed by the server."
        )));
    }
    let allowed = status("disruptionsAllowed");
    if allowed < 0 {
        return Err(ApiError::forbidden(
            &pdb_resource(),
            name,
            "pdb disruptions allowed is negative",
        ));
    }
    let disrupted = pdb
        .pointer("/status/disruptedPods")
        .and_then(Value::as_object)
        .map_or(0, |m| m.len());
    if disrupted > MAX_DISRUPTED_PODS {
        return Err(ApiError::forbidden(
            &pdb_resource(),
            name,
            "DisruptedPods map too big - too many evictions not confirmed by PDB controller",
        ));
    }
    if allowed == 0 {
        return Err(refused(budget_message(
            name,
            status("desiredHealthy"),
            status("currentHealthy"),
        )));
    }
    let mut out = pdb.clone();
    let st = out
        .as_object_mut()
        .expect("a budget is an object")
        .entry("status")
        .or_insert_with(|| json!({}));
    let Some(st) = st.as_object_mut() else {
        return Err(ApiError::internal("the budget's status is not an object"));
    };
    st.insert("disruptionsAllowed".into(), json!(allowed - 1));
    if allowed - 1 == 0 {
        update_disruption_allowed_condition(st, now);
    }
    let pods = st.entry("disruptedPods").or_insert_with(|| json!({}));
    if !pods.is_object() {
        *pods = json!({});
    }
    pods[pod] = json!(now);
    Ok(out)
}

impl ApiServer {
    /// The PodDisruptionBudgets of a namespace, from the watch cache.
    fn budgets_in(&self, namespace: &str) -> Vec<Value> {
        let Some(def) = self
            .registry()
            .get("policy", "v1", "poddisruptionbudgets")
            .cloned()
        else {
            return vec![];
        };
        self.caches
            .get(&def.storage_prefix())
            .list(&def.namespace_prefix(Some(namespace)), &Filter::all())
            .0
            .iter()
            .map(|o| o.object())
            .collect()
    }

    /// Evicts pod `namespace`/`name` (the `pods/eviction` subresource), deleting it with
    /// `delete` when the budgets allow.
    #[tracing::instrument(skip(self, delete), fields(pod = %name))]
    pub async fn evict(
        &self,
        namespace: &str,
        name: &str,
        delete: DeleteOptions,
    ) -> Result<Evicted, ApiError> {
        let pods = self
            .registry()
            .get("", "v1", "pods")
            .cloned()
            .ok_or_else(ApiError::not_found_path)?;
        let caller_pinned = delete.precondition_resource_version.is_some();
        let mut attempt = 0;
        let (pod, plan) = loop {
            attempt += 1;
            let pod = self.get_object(&pods, namespace, name).await?;
            let plan = plan(&pod, &self.budgets_in(namespace));
            let Plan::Delete { precondition } = plan else {
                break (pod, plan);
            };
            let mut opts = delete.clone();
            if precondition && !caller_pinned {
                opts.precondition_resource_version = Some(meta::resource_version(&pod).to_string());
            }
            match self.disrupt_and_delete(&pods, namespace, name, opts).await {
                Ok(()) => return Ok(Evicted::Deleted),
                // The pod changed since it was read: look again, unless the caller's own
                // precondition failed.
                Err(e) if e.code == 409 && !caller_pinned && attempt < RETRIES => continue,
                Err(e) => return Err(e),
            }
        };
        let mut opts = delete.clone();
        match &plan {
            Plan::TooManyBudgets => return Ok(Evicted::TooManyBudgets),
            Plan::Unguarded | Plan::Delete { .. } => {}
            Plan::UnhealthyDelete { .. } => {
                if !caller_pinned {
                    opts.precondition_resource_version =
                        Some(meta::resource_version(&pod).to_string());
                }
            }
            Plan::UseBudget { budget } => {
                self.use_budget(namespace, budget, name, delete.dry_run)
                    .await?
            }
        }
        match self.disrupt_and_delete(&pods, namespace, name, opts).await {
            Ok(()) => Ok(Evicted::Deleted),
            Err(e) if e.code == 409 && !caller_pinned => match plan {
                // The pod became ready since it was judged unhealthy: the client retries.
                Plan::UnhealthyDelete { budget } => Err(refused(format!(
                    "The disruption budget {budget} is still being processed by the server."
                ))),
                _ => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    /// Deletes the pod with `opts`, first (unless a dry run) giving its latest version the
    /// `DisruptionTarget` condition, as upstream's `addConditionAndDeletePod`: the delete's
    /// preconditions are checked against that version, and a resourceVersion precondition
    /// moves to the version the condition wrote.
    async fn disrupt_and_delete(
        &self,
        pods: &crate::registry::ResourceDef,
        namespace: &str,
        name: &str,
        mut opts: DeleteOptions,
    ) -> Result<(), ApiError> {
        // Retried on conflicts with a fresh read (the kubelet writes the status too), as
        // upstream's guaranteed update does; the caller's preconditions are checked each time.
        let mut attempt = 0;
        while !opts.dry_run {
            attempt += 1;
            let latest = self.get_object(pods, namespace, name).await?;
            let gr = GroupResource {
                group: String::new(),
                resource: "Pod".into(),
            };
            if let Some(uid) = opts
                .precondition_uid
                .as_deref()
                .filter(|u| *u != meta::uid(&latest))
            {
                return Err(ApiError::conflict(
                    &gr,
                    name,
                    &format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                        meta::uid(&latest)
                    ),
                ));
            }
            if let Some(rv) = opts
                .precondition_resource_version
                .as_deref()
                .filter(|rv| *rv != meta::resource_version(&latest))
            {
                return Err(ApiError::conflict(
                    &gr,
                    name,
                    &format!(
                        "the ResourceVersion in the precondition ({rv}) does not match the ResourceVersion in record ({}). The object might have been modified",
                        meta::resource_version(&latest)
                    ),
                ));
            }
            if let Some(marked) =
                with_disruption_target(&latest, &setpoint_api::time::now_rfc3339())
            {
                let write = WriteOptions {
                    field_manager: Some("eviction".into()),
                    ..WriteOptions::default()
                };
                // The body carries the version read: a pod changed meanwhile is a conflict.
                let written = match self
                    .update(pods, namespace, name, View::Status, marked, &write)
                    .await
                {
                    Ok(w) => w,
                    Err(e) if e.code == 409 && attempt < RETRIES => continue,
                    Err(e) => return Err(e),
                };
                if opts.precondition_resource_version.is_some() {
                    opts.precondition_resource_version =
                        Some(meta::resource_version(&written.object).to_string());
                }
            }
            break;
        }
        self.delete(pods, namespace, name, &opts).await.map(|_| ())
    }

    /// Uses one disruption of budget `budget` for `pod`, by a compare-and-swap on its status
    /// retried on conflicts.
    async fn use_budget(
        &self,
        namespace: &str,
        budget: &str,
        pod: &str,
        dry_run: bool,
    ) -> Result<(), ApiError> {
        let def = self
            .registry()
            .get("policy", "v1", "poddisruptionbudgets")
            .cloned()
            .ok_or_else(ApiError::not_found_path)?;
        for _ in 0..RETRIES {
            let pdb = self.get_object(&def, namespace, budget).await?;
            let updated = check_and_decrement(&pdb, pod, &setpoint_api::time::now_rfc3339())?;
            if dry_run {
                return Ok(());
            }
            let opts = WriteOptions {
                field_manager: Some("eviction".into()),
                ..WriteOptions::default()
            };
            // The body carries the resourceVersion read: the write fails with a conflict if
            // another eviction (or the controller) wrote the budget since.
            match self
                .update(&def, namespace, budget, View::Status, updated, &opts)
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) if e.code == 409 => continue,
                Err(e) => return Err(e),
            }
        }
        // Upstream's NewTimeoutError(message, 10).
        let mut e = ApiError::timeout(format!(
            "Timeout: couldn't update PodDisruptionBudget \"{budget}\" due to conflicts"
        ));
        e.details = Some(Box::new(setpoint_api::status::Details {
            retry_after_seconds: Some(10),
            ..Default::default()
        }));
        Err(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(phase: &str, ready: bool) -> Value {
        json!({"metadata": {"name": "p", "labels": {"app": "web"}, "resourceVersion": "7"},
               "status": {"phase": phase, "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}})
    }

    fn pdb(name: &str, status: Value) -> Value {
        json!({"metadata": {"name": name, "generation": 1},
               "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}},
               "status": status})
    }

    #[test]
    fn the_disruption_target_condition_as_upstream_sets_it() {
        let p = pod("Running", true);
        let marked = with_disruption_target(&p, "2026-01-01T00:00:00Z").unwrap();
        let c = marked["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "DisruptionTarget")
            .unwrap()
            .clone();
        assert_eq!(c["status"], "True");
        assert_eq!(c["reason"], "EvictionByEvictionAPI");
        assert_eq!(c["message"], "Eviction API: evicting");
        assert!(with_disruption_target(&marked, "2026-01-02T00:00:00Z").is_none());
        // Another reason is replaced; the transition time stays while the status does.
        let mut other = marked.clone();
        other["status"]["conditions"][1]["reason"] = json!("DeletionByTaintManager");
        let again = with_disruption_target(&other, "2026-01-03T00:00:00Z").unwrap();
        assert_eq!(
            again["status"]["conditions"][1]["reason"],
            "EvictionByEvictionAPI"
        );
        assert_eq!(
            again["status"]["conditions"][1]["lastTransitionTime"],
            "2026-01-01T00:00:00Z"
        );
    }

    #[test]
    fn disrupted_pods_are_deleted_without_budgets() {
        let budgets = [pdb("web", json!({"disruptionsAllowed": 0}))];
        assert_eq!(
            plan(&pod("Pending", false), &budgets),
            Plan::Delete { precondition: true }
        );
        assert_eq!(
            plan(&pod("Succeeded", false), &budgets),
            Plan::Delete {
                precondition: false
            }
        );
        let mut terminating = pod("Running", true);
        terminating["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        assert_eq!(
            plan(&terminating, &budgets),
            Plan::Delete { precondition: true }
        );
    }

    #[test]
    fn budgets_guarding_a_running_pod() {
        let running = pod("Running", true);
        assert_eq!(plan(&running, &[]), Plan::Unguarded);
        let web = pdb("web", json!({}));
        assert_eq!(
            plan(&running, std::slice::from_ref(&web)),
            Plan::UseBudget {
                budget: "web".into()
            }
        );
        assert_eq!(
            plan(&running, &[web.clone(), pdb("other", json!({}))]),
            Plan::TooManyBudgets
        );
        // An empty selector guards nothing here.
        let mut empty = pdb("all", json!({}));
        empty["spec"]["selector"] = json!({});
        assert_eq!(plan(&running, &[empty]), Plan::Unguarded);
    }

    #[test]
    fn unready_pods_and_the_unhealthy_policy() {
        let unready = pod("Running", false);
        let healthy_budget = pdb("web", json!({"currentHealthy": 2, "desiredHealthy": 2}));
        assert_eq!(
            plan(&unready, &[healthy_budget]),
            Plan::UnhealthyDelete {
                budget: "web".into()
            }
        );
        let short = pdb("web", json!({"currentHealthy": 1, "desiredHealthy": 2}));
        assert_eq!(
            plan(&unready, std::slice::from_ref(&short)),
            Plan::UseBudget {
                budget: "web".into()
            }
        );
        let mut always = short;
        always["spec"]["unhealthyPodEvictionPolicy"] = json!("AlwaysAllow");
        assert_eq!(
            plan(&unready, &[always]),
            Plan::UnhealthyDelete {
                budget: "web".into()
            }
        );
    }

    #[test]
    fn check_and_decrement_as_upstream() {
        let full = pdb(
            "web",
            json!({"observedGeneration": 1, "disruptionsAllowed": 0, "desiredHealthy": 2, "currentHealthy": 2}),
        );
        let e = check_and_decrement(&full, "p", "t").unwrap_err();
        assert_eq!(
            (e.code, e.reason.as_str(), e.message.as_str()),
            (429, "TooManyRequests", EVICTION_REFUSED)
        );
        let status = e.to_status();
        assert_eq!(
            status["details"],
            json!({"causes": [{"reason": "DisruptionBudget", "message": "The disruption budget web needs 2 healthy pods and has 2 currently"}]})
        );
        let one = pdb(
            "web",
            json!({"observedGeneration": 1, "disruptionsAllowed": 1, "desiredHealthy": 2, "currentHealthy": 3}),
        );
        let used = check_and_decrement(&one, "p", "t").unwrap();
        assert_eq!(used["status"]["disruptionsAllowed"], 0);
        assert_eq!(used["status"]["disruptedPods"], json!({"p": "t"}));
        assert_eq!(
            used["status"]["conditions"][0]["reason"],
            "InsufficientPods"
        );
        let stale = pdb(
            "web",
            json!({"observedGeneration": 0, "disruptionsAllowed": 3}),
        );
        let e = check_and_decrement(&stale, "p", "t").unwrap_err();
        assert_eq!(
            e.to_status()["details"]["causes"][0]["message"],
            "The disruption budget web is still being processed by the server."
        );
        let negative = pdb(
            "web",
            json!({"observedGeneration": 1, "disruptionsAllowed": -1}),
        );
        assert_eq!(
            check_and_decrement(&negative, "p", "t").unwrap_err().code,
            403
        );
    }
}
