//! The API server's own loop over CustomResourceDefinitions: establishes their resources,
//! keeps their status current, and empties a deleted CRD's resource before letting it go.
//!
//! It is level-triggered: every pass recomputes the whole registry from the CRDs the watch
//! cache holds (so a restart, or a missed event, changes nothing), and writes a CRD's status
//! only when it differs from what the pass computes.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use setpoint_api::meta;

use super::{resource_defs, CLEANUP_FINALIZER, CRD_GROUP};
use crate::objects::{DeleteOptions, WriteOptions};
use crate::registry::{Registry, ResourceDef};
use crate::state::ApiServer;
use crate::strategy::View;
use crate::watchcache::{Filter, WatchStart};

/// The field manager the server's CRD status writes are recorded under.
const MANAGER: &str = "setpoint-apiextensions-controller";
/// How often a terminating CRD's remaining objects are looked at again.
const CLEANUP_RECHECK: Duration = Duration::from_millis(500);

fn crd_resource(server: &ApiServer) -> Arc<ResourceDef> {
    server
        .registry()
        .get(CRD_GROUP, "v1", "customresourcedefinitions")
        .expect("CustomResourceDefinitions are built in")
        .clone()
}

fn condition(type_: &str, status: bool, reason: &str, message: &str) -> Value {
    json!({"type": type_, "status": if status { "True" } else { "False" },
           "reason": reason, "message": message})
}

/// The status the server maintains for `crd`, given whether its names conflict with a
/// resource already served (`conflict` says with what), keeping transition times of
/// conditions whose status did not change.
pub fn desired_status(crd: &Value, conflict: Option<&str>, now: &str) -> Value {
    let old = crd.get("status").cloned().unwrap_or_else(|| json!({}));
    let names = crd
        .pointer("/spec/names")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let accepted = conflict.is_none();
    let mut conditions = vec![
        match conflict {
            None => condition("NamesAccepted", true, "NoConflicts", "no conflicts found"),
            Some(c) => condition("NamesAccepted", false, "NameConflict", c),
        },
        if accepted {
            condition(
                "Established",
                true,
                "InitialNamesAccepted",
                "the initial names have been accepted",
            )
        } else {
            condition(
                "Established",
                false,
                "NotAccepted",
                "not all names are accepted",
            )
        },
    ];
    if meta::deletion_timestamp(crd).is_some() {
        conditions.push(json!({"type": "Terminating", "status": "True",
            "reason": "InstanceDeletionInProgress",
            "message": "CustomResource deletion is in progress"}));
    }
    let old_conditions = old["conditions"].as_array().cloned().unwrap_or_default();
    for c in &mut conditions {
        let prev = old_conditions.iter().find(|o| o["type"] == c["type"]);
        let t = match prev {
            Some(p) if p["status"] == c["status"] => p
                .get("lastTransitionTime")
                .cloned()
                .unwrap_or_else(|| json!(now)),
            _ => json!(now),
        };
        c["lastTransitionTime"] = t;
    }
    let mut stored: Vec<Value> = old["storedVersions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if let Some(v) = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .and_then(|vs| vs.iter().find(|v| v["storage"] == json!(true)))
        .and_then(|v| v.get("name"))
    {
        if !stored.contains(v) {
            stored.push(v.clone());
        }
    }
    let accepted_names = if accepted {
        names
    } else {
        old.get("acceptedNames")
            .cloned()
            .unwrap_or_else(|| json!({"plural": "", "kind": ""}))
    };
    json!({"acceptedNames": accepted_names, "storedVersions": stored, "conditions": conditions})
}

/// Why `defs` cannot be served next to what `registry` already serves, if they cannot.
fn name_conflict(registry: &Registry, defs: &[ResourceDef]) -> Option<String> {
    for d in defs {
        if registry.get(&d.group, &d.version, &d.plural).is_some() {
            return Some(format!("\"{}\" is already in use", d.plural));
        }
        if registry.by_kind(&d.group, &d.version, &d.kind).is_some() {
            return Some(format!("\"{}\" is already in use", d.kind));
        }
    }
    None
}

/// Resolves once the server is stopping.
pub(crate) async fn stopped(stopping: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stopping.wait_for(|s| *s).await;
}

impl ApiServer {
    /// One pass: rebuilds the served resources from the CRDs, writes CRD statuses that are
    /// out of date, and cleans up terminating CRDs. Returns whether any CRD is terminating
    /// (the caller looks again soon).
    pub(crate) async fn sync_crds(&self) -> bool {
        let res = crd_resource(self);
        let cache = self.caches.get(&res.storage_prefix());
        let (objs, _) = cache.list(&res.storage_prefix(), &Filter::all());
        let mut crds: Vec<Value> = objs.iter().map(|o| o.object()).collect();
        // A CRD whose names were accepted keeps them; among the rest, the older one wins.
        let accepted = |o: &Value| {
            o.pointer("/status/conditions")
                .and_then(Value::as_array)
                .is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c["type"] == "NamesAccepted" && c["status"] == "True")
                })
        };
        crds.sort_by(|a, b| {
            let t = |o: &Value| {
                o.pointer("/metadata/creationTimestamp")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string()
            };
            accepted(b)
                .cmp(&accepted(a))
                .then_with(|| t(a).cmp(&t(b)))
                .then_with(|| meta::name(a).cmp(meta::name(b)))
        });
        let mut registry = Registry::builtin();
        let now = setpoint_api::time::now_rfc3339();
        let mut terminating = Vec::new();
        let mut statuses = Vec::new();
        for crd in &crds {
            let defs = resource_defs(crd);
            let conflict = name_conflict(&registry, &defs);
            if conflict.is_none() {
                for d in defs {
                    registry.add(d);
                }
            }
            let desired = desired_status(crd, conflict.as_deref(), &now);
            if crd.get("status") != Some(&desired) {
                statuses.push((meta::name(crd).to_string(), desired));
            }
            if meta::deletion_timestamp(crd).is_some() {
                terminating.push(crd.clone());
            }
        }
        if self.registry().all() != registry.all() {
            tracing::info!(
                resources = registry.all().len(),
                "custom resources changed; serving the new set"
            );
            self.set_registry(registry);
        }
        let opts = WriteOptions {
            field_manager: Some(MANAGER.into()),
            ..WriteOptions::default()
        };
        for (name, status) in statuses {
            let patch = crate::patch::Patch::Merge(json!({"status": status}));
            if let Err(e) = self
                .patch(&res, "", &name, View::Status, &patch, &opts)
                .await
            {
                if e.code != 404 && e.code != 409 {
                    tracing::warn!(crd = %name, error = %e.message, "writing CRD status");
                }
            }
        }
        for crd in &terminating {
            self.clean_up_crd(&res, crd, &opts).await;
        }
        !terminating.is_empty()
    }

    /// Deletes a terminating CRD's objects; once none is left, releases the CRD.
    async fn clean_up_crd(&self, res: &ResourceDef, crd: &Value, opts: &WriteOptions) {
        let finalizers: Vec<Value> = crd
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if !finalizers.iter().any(|f| f == CLEANUP_FINALIZER) {
            return;
        }
        let name = meta::name(crd);
        let defs = resource_defs(crd);
        let registry = self.registry();
        // The registered storage version (only registered if its names were accepted).
        let storage = defs.iter().find_map(|d| {
            registry
                .get(&d.group, &d.version, &d.plural)
                .filter(|r| {
                    !r.is_converted() && r.custom.as_ref().is_some_and(|c| c.crd_name == name)
                })
                .cloned()
        });
        if let Some(def) = storage {
            let cache = self.caches.get(&def.storage_prefix());
            let (objs, _) = cache.list(&def.storage_prefix(), &Filter::all());
            if !objs.is_empty() {
                for o in objs {
                    if meta::deletion_timestamp(&o.object()).is_some() {
                        continue;
                    }
                    let (ns, n) = (o.attrs.namespace().to_string(), o.attrs.name().to_string());
                    if let Err(e) = self.delete(&def, &ns, &n, &DeleteOptions::default()).await {
                        if e.code != 404 {
                            tracing::warn!(crd = %name, object = %n, error = %e.message, "deleting a custom object");
                        }
                    }
                }
                return;
            }
        }
        let rest: Vec<Value> = finalizers
            .into_iter()
            .filter(|f| f != CLEANUP_FINALIZER)
            .collect();
        let patch = crate::patch::Patch::Merge(json!({"metadata": {"finalizers": rest}}));
        if let Err(e) = self.patch(res, "", name, View::Main, &patch, opts).await {
            if e.code != 404 {
                tracing::warn!(crd = %name, error = %e.message, "releasing a CRD");
            }
        }
    }

    /// Follows CRD changes until the server stops.
    pub(crate) async fn crd_loop(self: Arc<Self>) {
        let res = crd_resource(&self);
        let mut stopping = self.stopping_signal();
        loop {
            let cache = self.caches.get(&res.storage_prefix());
            let mut handle = match cache.watch(WatchStart::CurrentState, Filter::all(), false) {
                Ok(h) => h,
                Err(e) => {
                    tracing::warn!(error = %e.message, "watching CRDs");
                    tokio::select! {
                        _ = tokio::time::sleep(CLEANUP_RECHECK) => continue,
                        _ = stopped(&mut stopping) => return,
                    }
                }
            };
            let mut terminating = self.sync_crds().await;
            loop {
                let recheck = async {
                    if terminating {
                        tokio::time::sleep(CLEANUP_RECHECK).await
                    } else {
                        std::future::pending().await
                    }
                };
                tokio::select! {
                    item = handle.next_live() => {
                        if item.is_none() {
                            break;
                        }
                        // One pass covers every event queued so far.
                        while handle.try_next_live().is_some() {}
                        terminating = self.sync_crds().await;
                    }
                    _ = recheck => terminating = self.sync_crds().await,
                    _ = stopped(&mut stopping) => return,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_reports_acceptance_and_keeps_transition_times() {
        let mut crd = super::super::tests::crd();
        let s = desired_status(&crd, None, "2026-01-01T00:00:00Z");
        assert_eq!(s["conditions"][0]["type"], "NamesAccepted");
        assert_eq!(s["conditions"][1]["status"], "True");
        assert_eq!(s["storedVersions"], json!(["v1"]));
        assert_eq!(s["acceptedNames"]["plural"], "cronbackups");
        crd["status"] = s.clone();
        let again = desired_status(&crd, None, "2026-01-02T00:00:00Z");
        assert_eq!(again, s, "nothing changed: the same status, same times");
        crd["metadata"]["deletionTimestamp"] = json!("2026-01-02T00:00:00Z");
        let t = desired_status(&crd, None, "2026-01-02T00:00:00Z");
        assert_eq!(t["conditions"][2]["type"], "Terminating");
        let conflicted = desired_status(
            &super::super::tests::crd(),
            Some("\"cronbackups\" is already in use"),
            "x",
        );
        assert_eq!(conflicted["conditions"][0]["status"], "False");
        assert_eq!(conflicted["conditions"][1]["status"], "False");
    }

    #[test]
    fn conflicts_with_served_names_are_found() {
        let reg = Registry::builtin();
        let mut clash = resource_defs(&super::super::tests::crd());
        clash[0].group = "apps".into();
        clash[0].plural = "deployments".into();
        assert!(name_conflict(&reg, &clash).is_some());
        assert!(name_conflict(&reg, &resource_defs(&super::super::tests::crd())).is_none());
    }
}
