//! The namespace controller: empties a terminating namespace, then releases it.
//!
//! Deleting a namespace only marks it (`deletionTimestamp`, `status.phase: Terminating`)
//! while `spec.finalizers` holds `kubernetes`. This controller deletes everything inside it,
//! waits for that content to go (objects may have finalizers of their own), reports progress
//! in the namespace's conditions, and finally removes `kubernetes` through the `finalize`
//! subresource so the server can remove the namespace.
//!
//! [`plan`] is the pure decision; [`NamespaceController`] does the I/O around it.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use k8s_openapi::api::core::v1::{Namespace, NamespaceCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use setpoint_runtime::client::{Api, Client, DeleteParams, DynamicObject, ListParams, PostParams};
use setpoint_runtime::controller::{Action, Context, Controller, ReconcileError, Reconciler};
use setpoint_runtime::decision;
use setpoint_runtime::informer::{Scope, SharedInformers, Store};
use setpoint_runtime::{Object, ObjectKey};

use crate::discovery::{self, ServedResource};

/// The finalizer in `spec.finalizers` that this controller owns.
pub const FINALIZER: &str = "kubernetes";
/// The controller's name (work queue, metrics, logs).
pub const NAME: &str = "namespace";

/// Condition: some content could not be deleted.
pub const CONTENT_FAILURE: &str = "NamespaceDeletionContentFailure";
/// Condition: resources could not be discovered.
pub const DISCOVERY_FAILURE: &str = "NamespaceDeletionDiscoveryFailure";
/// Condition: content still exists.
pub const CONTENT_REMAINING: &str = "NamespaceContentRemaining";
/// Condition: remaining content is held by finalizers.
pub const FINALIZERS_REMAINING: &str = "NamespaceFinalizersRemaining";

/// How long to wait before looking at a namespace's remaining content again.
pub const RECHECK: Duration = Duration::from_secs(1);
/// How long a discovery answer is reused: a namespace waiting on finalizers is re-checked
/// every second, and rediscovering every group each time would cost far more requests than
/// listing its content.
const DISCOVERY_TTL: Duration = Duration::from_secs(30);

/// One object found in a terminating namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Content {
    /// The resource, as `plural` or `plural.group`.
    pub resource: String,
    /// The object's `metadata.name`.
    pub name: String,
    /// The object's `metadata.uid`, sent as a delete precondition.
    pub uid: String,
    /// The object's `metadata.finalizers`: while any remain, it blocks the namespace's
    /// finalization.
    pub finalizers: Vec<String>,
    /// Already has a `deletionTimestamp`: deleting it again changes nothing.
    pub deleting: bool,
}

/// What one pass over a terminating namespace should do.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Indexes into the content of the objects to delete now.
    pub delete: Vec<usize>,
    /// The namespace's deletion conditions (without transition times).
    pub conditions: Vec<NamespaceCondition>,
    /// Nothing remains: remove the `kubernetes` finalizer.
    pub finalize: bool,
}

/// Whether this controller has work on the namespace: it is being deleted and still holds
/// the `kubernetes` finalizer.
pub fn needs_cleanup(ns: &Namespace) -> bool {
    ns.metadata.deletion_timestamp.is_some()
        && ns
            .spec
            .as_ref()
            .and_then(|s| s.finalizers.as_ref())
            .is_some_and(|f| f.iter().any(|f| f == FINALIZER))
}

fn condition(type_: &str, status: bool, reason: &str, message: String) -> NamespaceCondition {
    NamespaceCondition {
        type_: type_.into(),
        status: if status { "True" } else { "False" }.into(),
        reason: Some(reason.into()),
        message: Some(message),
        last_transition_time: None,
    }
}

/// The pure decision: given what a namespace still contains and what went wrong finding or
/// deleting it, which objects to delete, which conditions to report, and whether the
/// namespace can be released.
pub fn plan(
    content: &[Content],
    discovery_failures: &[String],
    delete_failures: &[String],
) -> Plan {
    let delete = content
        .iter()
        .enumerate()
        .filter(|(_, c)| !c.deleting)
        .map(|(i, _)| i)
        .collect();

    let mut per_resource: BTreeMap<&str, usize> = BTreeMap::new();
    let mut per_finalizer: BTreeMap<&str, usize> = BTreeMap::new();
    for c in content {
        *per_resource.entry(&c.resource).or_default() += 1;
        for f in &c.finalizers {
            *per_finalizer.entry(f).or_default() += 1;
        }
    }
    let list = |m: &BTreeMap<&str, usize>, sep: &str| {
        m.iter()
            .map(|(k, n)| format!("{k}{sep}{n} resource instances"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let conditions = vec![
        if discovery_failures.is_empty() {
            condition(
                DISCOVERY_FAILURE,
                false,
                "ResourcesDiscovered",
                "All resources successfully discovered".into(),
            )
        } else {
            condition(
                DISCOVERY_FAILURE,
                true,
                "DiscoveryFailed",
                format!("Discovery failed: {}", discovery_failures.join("; ")),
            )
        },
        if delete_failures.is_empty() {
            condition(
                CONTENT_FAILURE,
                false,
                "ContentDeleted",
                "All content successfully deleted, may be waiting on finalization".into(),
            )
        } else {
            condition(
                CONTENT_FAILURE,
                true,
                "ContentDeletionFailed",
                format!(
                    "Failed to delete all resource types, {} remaining: {}",
                    delete_failures.len(),
                    delete_failures.join("; ")
                ),
            )
        },
        if per_resource.is_empty() {
            condition(
                CONTENT_REMAINING,
                false,
                "ContentRemoved",
                "All content successfully removed".into(),
            )
        } else {
            condition(
                CONTENT_REMAINING,
                true,
                "SomeResourcesRemain",
                format!(
                    "Some resources are remaining: {}",
                    list(&per_resource, " has ")
                ),
            )
        },
        if per_finalizer.is_empty() {
            condition(
                FINALIZERS_REMAINING,
                false,
                "ContentHasNoFinalizers",
                "All content-preserving finalizers finished".into(),
            )
        } else {
            condition(
                FINALIZERS_REMAINING,
                true,
                "SomeFinalizersRemain",
                format!(
                    "Some content in the namespace has finalizers remaining: {}",
                    list(&per_finalizer, " in ")
                ),
            )
        },
    ];
    Plan {
        delete,
        conditions,
        finalize: content.is_empty() && discovery_failures.is_empty() && delete_failures.is_empty(),
    }
}

/// Merges freshly computed conditions into the namespace's current ones: a condition whose
/// status did not change keeps its transition time. Returns `None` when nothing changed, so
/// that an unchanged pass writes nothing.
pub fn merge_conditions(
    current: &[NamespaceCondition],
    fresh: &[NamespaceCondition],
    now: &Time,
) -> Option<Vec<NamespaceCondition>> {
    let mut out: Vec<NamespaceCondition> = current
        .iter()
        .filter(|c| !fresh.iter().any(|f| f.type_ == c.type_))
        .cloned()
        .collect();
    let mut changed = false;
    for f in fresh {
        let old = current.iter().find(|c| c.type_ == f.type_);
        let mut c = f.clone();
        match old {
            Some(o) if o.status == f.status => {
                c.last_transition_time = o.last_transition_time.clone();
                changed |= o.reason != f.reason || o.message != f.message;
            }
            _ => {
                c.last_transition_time = Some(now.clone());
                changed = true;
            }
        }
        out.push(c);
    }
    changed.then_some(out)
}

/// The reconciler of namespaces.
pub struct NamespaceController {
    client: Client,
    namespaces: Store<Namespace>,
    discovered: Mutex<Option<(Instant, Vec<ServedResource>)>>,
}

impl NamespaceController {
    /// The namespaced resources whose objects a namespace deletion must remove.
    /// Also says whether the answer came from the cache.
    async fn resources(&self) -> Result<(Vec<ServedResource>, bool), ReconcileError> {
        if let Some((at, r)) = &*self.discovered.lock().unwrap_or_else(|e| e.into_inner()) {
            if at.elapsed() < DISCOVERY_TTL {
                return Ok((r.clone(), true));
            }
        }
        let all = discovery::served_resources(&self.client)
            .await
            .map_err(ReconcileError::retry)?;
        let r: Vec<ServedResource> = all
            .into_iter()
            .filter(|r| r.resource.namespaced && r.supports("list") && r.supports("delete"))
            .collect();
        *self.discovered.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((Instant::now(), r.clone()));
        Ok((r, false))
    }

    /// Everything in the namespace, one entry per object even when two resources (e.g. the
    /// two event APIs) serve it.
    async fn content(
        &self,
        namespace: &str,
        resources: &[ServedResource],
    ) -> (Vec<(Content, ServedResource)>, Vec<String>) {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        let mut failures = Vec::new();
        for r in resources {
            let api = Api::dynamic(self.client.clone(), &r.resource, Some(namespace));
            match api.list_all(&ListParams::default()).await {
                Ok(list) => {
                    for o in list.items {
                        let uid = o.uid().unwrap_or_default();
                        if !seen.insert(uid.clone()) {
                            continue;
                        }
                        out.push((
                            Content {
                                resource: r.id(),
                                name: o.name(),
                                uid,
                                finalizers: finalizers(&o),
                                deleting: o.deletion_timestamp_set(),
                            },
                            r.clone(),
                        ));
                    }
                }
                Err(e) => failures.push(format!("listing {}: {e}", r.id())),
            }
        }
        (out, failures)
    }

    async fn write_conditions(&self, ns: &Namespace, fresh: &[NamespaceCondition]) {
        let current = ns
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        let now = now();
        let Some(merged) = merge_conditions(&current, fresh, &now) else {
            return;
        };
        if decision::recording() {
            let changed: Vec<String> = fresh
                .iter()
                .filter(|f| {
                    !current.iter().any(|c| {
                        c.type_ == f.type_
                            && c.status == f.status
                            && c.reason == f.reason
                            && c.message == f.message
                    })
                })
                .map(|f| format!("{}={}", f.type_, f.status))
                .collect();
            decision::action(
                "update status conditions",
                format!("the deletion conditions changed: {}", changed.join(", ")),
            );
        }
        let api: Api<Namespace> = Api::all(self.client.clone());
        let name = ns.metadata.name.clone().unwrap_or_default();
        // An update, as upstream's controller writes it: its role
        // (`system:controller:namespace-controller`) grants update of namespaces/status, not
        // patch.
        let mut next = ns.clone();
        next.status.get_or_insert_with(Default::default).conditions = Some(merged);
        // Conditions only report progress: failing to write them must not hold up deletion.
        if let Err(e) = api
            .replace_status(&name, &PostParams::default(), &next)
            .await
        {
            tracing::warn!(namespace = %name, error = %e, "could not update namespace conditions");
        }
    }

    /// Removes `kubernetes` from `spec.finalizers` through the `finalize` subresource.
    async fn finalize(&self, name: &str) -> Result<(), ReconcileError> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let Some(mut ns) = api.get_opt(name).await? else {
            return Ok(());
        };
        if !needs_cleanup(&ns) {
            return Ok(());
        }
        if let Some(f) = ns.spec.as_mut().and_then(|s| s.finalizers.as_mut()) {
            f.retain(|f| f != FINALIZER);
        }
        let body = serde_json::to_vec(&ns).map_err(ReconcileError::retry)?;
        let path = format!("/api/v1/namespaces/{name}/finalize");
        decision::action(
            format!("remove finalizer {FINALIZER} (finalize)"),
            "nothing remains in the namespace (fresh discovery, no failures)",
        );
        match self
            .client
            .request(
                http::Method::PUT,
                &path,
                Some("application/json"),
                Bytes::from(body),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// The current time as a `metav1.Time` (whole seconds, as the API stores it).
fn now() -> Time {
    Time(crate::now())
}

fn finalizers(o: &DynamicObject) -> Vec<String> {
    o.0.pointer("/metadata/finalizers")
        .and_then(|v| v.as_array())
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(String::from))
        .collect()
}

/// Up to five names, then how many more: short enough for one line of a decision record.
fn some_names<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let names: Vec<&str> = names.into_iter().collect();
    let shown = names.iter().take(5).copied().collect::<Vec<_>>().join(", ");
    match names.len() {
        n if n > 5 => format!("{shown} and {} more", n - 5),
        _ => shown,
    }
}

/// What a terminating namespace still holds, per resource (and how much of it is already
/// being deleted), and which finalizers hold it, for the decision record.
fn remaining_summary(content: &[Content]) -> String {
    if content.is_empty() {
        return "nothing remains in the namespace".into();
    }
    let mut per_resource: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    let mut per_finalizer: BTreeMap<&str, usize> = BTreeMap::new();
    for c in content {
        let e = per_resource.entry(&c.resource).or_default();
        e.0 += 1;
        e.1 += usize::from(c.deleting);
        for f in &c.finalizers {
            *per_finalizer.entry(f).or_default() += 1;
        }
    }
    let resources = per_resource
        .iter()
        .map(|(r, (n, deleting))| match deleting {
            0 => format!("{r} {n}"),
            d => format!("{r} {n} ({d} being deleted)"),
        })
        .collect::<Vec<_>>()
        .join(", ");
    let finalizers = if per_finalizer.is_empty() {
        "none".to_string()
    } else {
        per_finalizer
            .iter()
            .map(|(f, n)| format!("{f} on {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!("remaining: {resources}; their finalizers: {finalizers}")
}

#[async_trait::async_trait]
impl Reconciler for NamespaceController {
    async fn reconcile(&self, ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(ns) = self.namespaces.get(key) else {
            ctx.observe("the namespace is gone");
            return Ok(Action::Done);
        };
        let phase = ns
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .unwrap_or("Active");
        if !needs_cleanup(&ns) {
            ctx.observe(if ns.metadata.deletion_timestamp.is_none() {
                format!("phase {phase}, not being deleted: nothing to do")
            } else {
                format!("phase {phase}, being deleted; the {FINALIZER} finalizer is already gone")
            });
            return Ok(Action::Done);
        }
        let name = key.name.as_str();
        let (resources, cached, discovery_failures) = match self.resources().await {
            Ok((r, cached)) => (r, cached, Vec::new()),
            Err(e) => (Vec::new(), false, vec![e.message]),
        };
        let (content, list_failures) = self.content(name, &resources).await;
        let listed: Vec<Content> = content.iter().map(|(c, _)| c.clone()).collect();
        let first = plan(&listed, &discovery_failures, &list_failures);
        if ctx.recording() {
            let finalizers = ns
                .spec
                .as_ref()
                .and_then(|s| s.finalizers.as_deref())
                .unwrap_or_default()
                .join(", ");
            ctx.observe(format!(
                "phase {phase}, spec.finalizers [{finalizers}]; {} namespaced resource(s) discovered{}",
                resources.len(),
                if cached { " (cached)" } else { "" },
            ));
            ctx.observe(remaining_summary(&listed));
            if !discovery_failures.is_empty() || !list_failures.is_empty() {
                ctx.observe(format!(
                    "discovery failed: {}; listing failed for {} resource(s)",
                    if discovery_failures.is_empty() {
                        "no"
                    } else {
                        "yes"
                    },
                    list_failures.len()
                ));
            }
            // One action per resource (the content comes resource by resource).
            let mut by_resource: Vec<(&str, Vec<&str>)> = Vec::new();
            for &i in &first.delete {
                let c = &content[i].0;
                match by_resource.last_mut() {
                    Some((r, names)) if *r == c.resource => names.push(&c.name),
                    _ => by_resource.push((&c.resource, vec![&c.name])),
                }
            }
            for (resource, names) in by_resource {
                ctx.action(
                    format!("delete {} {resource}: {}", names.len(), some_names(names)),
                    "the namespace is terminating and they are not being deleted yet",
                );
            }
        }
        let mut delete_failures = list_failures;
        for &i in &first.delete {
            let (c, r) = &content[i];
            let api = Api::dynamic(self.client.clone(), &r.resource, Some(name));
            let params = DeleteParams {
                propagation_policy: Some("Background".into()),
                precondition_uid: Some(c.uid.clone()),
                ..Default::default()
            };
            match api.delete(&c.name, &params).await {
                Ok(_) => {}
                // Gone already, or replaced by a newer object the next pass will see.
                Err(e) if e.is_not_found() || e.is_conflict() => {}
                Err(e) => delete_failures.push(format!("deleting {} {}: {e}", c.resource, c.name)),
            }
        }
        let outcome = plan(&listed, &discovery_failures, &delete_failures);
        self.write_conditions(&ns, &outcome.conditions).await;
        if outcome.finalize && cached {
            ctx.observe("empty by cached discovery: discovering afresh before finalizing");
            // Releasing is final: confirm emptiness against fresh discovery, so that objects
            // of a resource added since (a new CRD) are not left behind.
            *self.discovered.lock().unwrap_or_else(|e| e.into_inner()) = None;
            return Ok(Action::RequeueAfter(Duration::ZERO));
        }
        if outcome.finalize {
            self.finalize(name).await?;
            tracing::info!(namespace = %name, "namespace emptied and finalized");
            return Ok(Action::Done);
        }
        tracing::debug!(namespace = %name, remaining = listed.len(), "waiting for namespace content to go");
        Ok(Action::RequeueAfter(RECHECK))
    }
}

/// Builds the namespace controller.
pub fn controller(client: Client, informers: &SharedInformers) -> Controller {
    let reconciler = NamespaceController {
        client,
        namespaces: informers.typed::<Namespace>(Scope::all()).store(),
        discovered: Mutex::new(None),
    };
    Controller::for_type::<Namespace>(NAME, informers, None).build(Arc::new(reconciler))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn item(resource: &str, name: &str, finalizers: &[&str], deleting: bool) -> Content {
        Content {
            resource: resource.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            finalizers: finalizers.iter().map(|s| s.to_string()).collect(),
            deleting,
        }
    }

    fn cond<'a>(p: &'a Plan, t: &str) -> &'a NamespaceCondition {
        p.conditions.iter().find(|c| c.type_ == t).unwrap()
    }

    #[test]
    fn empty_namespace_is_finalized() {
        let p = plan(&[], &[], &[]);
        assert!(p.finalize);
        assert!(p.delete.is_empty());
        assert_eq!(cond(&p, CONTENT_REMAINING).status, "False");
        assert_eq!(cond(&p, FINALIZERS_REMAINING).status, "False");
        assert_eq!(cond(&p, CONTENT_FAILURE).status, "False");
    }

    #[test]
    fn content_is_deleted_once_and_finalizers_are_reported() {
        let content = [
            item("configmaps", "a", &[], false),
            item("configmaps", "b", &["example.com/hold"], true),
            item("deployments.apps", "web", &[], false),
        ];
        let p = plan(&content, &[], &[]);
        assert!(!p.finalize);
        assert_eq!(p.delete, vec![0, 2]);
        let remaining = cond(&p, CONTENT_REMAINING);
        assert_eq!(remaining.status, "True");
        assert_eq!(remaining.reason.as_deref(), Some("SomeResourcesRemain"));
        assert!(remaining
            .message
            .as_ref()
            .unwrap()
            .contains("configmaps has 2 resource instances"));
        let fins = cond(&p, FINALIZERS_REMAINING);
        assert_eq!(fins.status, "True");
        assert!(fins
            .message
            .as_ref()
            .unwrap()
            .contains("example.com/hold in 1 resource instances"));
    }

    #[test]
    fn failures_block_finalization() {
        let p = plan(&[], &[], &["deleting pods x: forbidden".into()]);
        assert!(!p.finalize);
        assert_eq!(cond(&p, CONTENT_FAILURE).status, "True");
        let p = plan(&[], &["apps/v1: timeout".into()], &[]);
        assert!(!p.finalize);
        assert_eq!(cond(&p, DISCOVERY_FAILURE).status, "True");
    }

    #[test]
    fn unchanged_conditions_are_not_rewritten() {
        let t0 = Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap());
        let t1 = Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_060).unwrap());
        let fresh = plan(&[item("pods", "p", &[], true)], &[], &[]).conditions;
        let first = merge_conditions(&[], &fresh, &t0).unwrap();
        assert!(first
            .iter()
            .all(|c| c.last_transition_time == Some(t0.clone())));
        assert_eq!(merge_conditions(&first, &fresh, &t1), None);
        // Content gone: the remaining condition flips and gets a new transition time.
        let done = plan(&[], &[], &[]).conditions;
        let second = merge_conditions(&first, &done, &t1).unwrap();
        let remaining = second
            .iter()
            .find(|c| c.type_ == CONTENT_REMAINING)
            .unwrap();
        assert_eq!(remaining.last_transition_time, Some(t1));
        let failure = second.iter().find(|c| c.type_ == CONTENT_FAILURE).unwrap();
        assert_eq!(failure.last_transition_time, Some(t0));
    }

    #[test]
    fn only_terminating_namespaces_with_the_finalizer_need_cleanup() {
        let mut ns: Namespace = serde_json::from_value(
            json!({"metadata": {"name": "demo"}, "spec": {"finalizers": ["kubernetes"]}}),
        )
        .unwrap();
        assert!(!needs_cleanup(&ns));
        ns.metadata.deletion_timestamp = Some(now());
        assert!(needs_cleanup(&ns));
        ns.spec.as_mut().unwrap().finalizers = Some(vec![]);
        assert!(!needs_cleanup(&ns));
    }
}
