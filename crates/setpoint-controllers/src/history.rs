//! What the controllers that keep their history in ControllerRevisions (StatefulSet,
//! DaemonSet) share: a revision's `data` is the patch that puts the pod template back,
//! `{"spec":{"template":{…,"$patch":"replace"}}}`, which `kubectl rollout undo` applies as a
//! strategic merge patch; the order revisions are listed in; and whether a revision a create
//! found in place is the one it wanted. Revision names hash the template with the Deployment
//! controller's rule ([`crate::deployment::template_hash`]).

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use serde_json::{json, Value};
use setpoint_runtime::Object;

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
