//! What the controllers that keep their history in ControllerRevisions (StatefulSet,
//! DaemonSet) share: a revision's `data` is the patch that puts the pod template back,
//! `{"spec":{"template":{…,"$patch":"replace"}}}`, which `kubectl rollout undo` applies as a
//! strategic merge patch; the order revisions are listed in; and whether a revision a create
//! found in place is the one it wanted; and the writes a pass makes ([`Write`], [`write`]).
//! Revision names hash the template with the Deployment controller's rule
//! ([`crate::deployment::template_hash`]).

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use serde_json::{json, Value};
use setpoint_runtime::client::{Api, Patch, PatchParams, PostParams};
use setpoint_runtime::controller::ReconcileError;
use setpoint_runtime::{decision, Object};

/// What an owner's history needs written this pass.
#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    /// The template has no revision yet: create this one.
    Create(Box<ControllerRevision>),
    /// An older revision has the template again (a rollback): give it the next number.
    Renumber {
        /// The revision's name.
        name: String,
        /// Its new number.
        revision: i64,
    },
}

/// Makes `write` for the `kind` (`StatefulSet`, `DaemonSet`) named `owner`, recording it in
/// the pass's decision. A create answered AlreadyExists is done when the revision found is
/// the one wanted ([`is_same_revision`]): most often this pass's own revision, created by an
/// earlier pass whose answer was lost (the API server went down) and not in the cache yet, as
/// upstream reads and uses it. Failing until the cache shows it made the key back off for as
/// long as the cache lagged (a failed key's retry is a floor the revision's own event does
/// not lower), so a rollout stood still well after an API server restart. Any other revision
/// under that name is an `Err` to retry.
pub async fn write(
    api: &Api<ControllerRevision>,
    write: &Write,
    kind: &str,
    owner: &str,
) -> Result<(), ReconcileError> {
    match write {
        Write::Create(rev) => {
            decision::action(
                format!(
                    "create ControllerRevision {} (revision {})",
                    rev.name(),
                    rev.revision
                ),
                format!("no revision has the {kind}'s pod template"),
            );
            match api.create(&PostParams::default(), rev).await {
                Ok(_) => Ok(()),
                Err(e) if e.is_already_exists() => match api.get_opt(&rev.name()).await? {
                    Some(existing) if is_same_revision(&existing, rev) => Ok(()),
                    _ => Err(ReconcileError::retry(format!(
                        "controller revision {} of {kind} {owner} exists but is not in the cache yet",
                        rev.name(),
                    ))),
                },
                Err(e) => Err(e.into()),
            }
        }
        Write::Renumber { name, revision } => {
            decision::action(
                format!("renumber ControllerRevision {name} to revision {revision}"),
                "an older revision has the pod template again (a rollback)",
            );
            let patch = Patch::Merge(json!({"revision": revision}));
            api.patch(name, &PatchParams::default(), &patch).await?;
            Ok(())
        }
    }
}

/// A revision's `data`: the patch that restores `template`.
pub fn revision_data(template: &PodTemplateSpec) -> Value {
    let mut t = serde_json::to_value(template).unwrap_or_else(|_| json!({}));
    if let Some(o) = t.as_object_mut() {
        o.insert("$patch".into(), json!("replace"));
    }
    json!({"spec": {"template": t}})
}

/// The template a revision restores; `None` for data of another shape.
pub fn template_of(rev: &ControllerRevision) -> Option<PodTemplateSpec> {
    let mut t = rev.data.as_ref()?.0.pointer("/spec/template")?.clone();
    if let Some(o) = t.as_object_mut() {
        o.remove("$patch");
    }
    serde_json::from_value(t).ok()
}

/// Whether `existing`, found under `wanted`'s name when creating `wanted`, is that very
/// revision: the same template, controlled by the same owner. An earlier attempt at the create
/// may have succeeded with its answer lost (an API server going down), and the owner's
/// revision cache shows it only once its informer catches up; upstream's
/// `CreateControllerRevision` likewise reads the one that exists and uses it when its data
/// is the same.
pub fn is_same_revision(existing: &ControllerRevision, wanted: &ControllerRevision) -> bool {
    let controller = |r: &ControllerRevision| {
        r.owner_references()
            .into_iter()
            .find(|o| o.controller == Some(true))
            .map(|o| o.uid)
    };
    existing.metadata.deletion_timestamp.is_none()
        && controller(existing).is_some()
        && controller(existing) == controller(wanted)
        && template_of(existing).is_some()
        && template_of(existing) == template_of(wanted)
}

/// Revisions in history order: by number, then name.
pub fn in_order<'a>(revisions: &[&'a ControllerRevision]) -> Vec<&'a ControllerRevision> {
    let mut out = revisions.to_vec();
    out.sort_by(|a, b| {
        a.revision
            .cmp(&b.revision)
            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_restores_the_template_and_revisions_sort_by_number() {
        let t: PodTemplateSpec = serde_json::from_value(json!({
            "metadata": {"labels": {"app": "x"}},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
        }))
        .unwrap();
        let data = revision_data(&t);
        assert_eq!(data["spec"]["template"]["$patch"], "replace");
        let rev = |name: &str, n: i64| ControllerRevision {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            data: Some(k8s_openapi::apimachinery::pkg::runtime::RawExtension(
                data.clone(),
            )),
            revision: n,
        };
        let (old, newest, tied) = (rev("b", 2), rev("a", 10), rev("c", 2));
        assert_eq!(template_of(&old), Some(t));
        let order: Vec<&str> = in_order(&[&newest, &tied, &old])
            .iter()
            .map(|r| r.metadata.name.as_deref().unwrap())
            .collect();
        assert_eq!(order, vec!["b", "c", "a"], "by number, then name");
    }
}
