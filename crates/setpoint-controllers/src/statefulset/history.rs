//! Revision history in ControllerRevisions: each distinct pod template is a revision named
//! `<set>-<hash>`, numbered in the order it was (last) rolled out, whose `data` is the patch
//! that puts the template back (`{"spec":{"template":{…,"$patch":"replace"}}}`), which is
//! what `kubectl rollout undo statefulset/x` applies. `kubectl rollout history` lists them.
//!
//! The hash is the Deployment controller's pod-template hash ([`crate::deployment::template_hash`]):
//! one rule for naming a template, over the template and the collision count.

use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use serde_json::json;
use setpoint_runtime::Object;

use super::identity::{owner_reference, pod_revision, REVISION_LABEL};

pub use crate::history::Write;

/// The set's revisions resolved against its template and status.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolved {
    /// The revision of `spec.template` (`status.updateRevision`).
    pub update: String,
    /// The template of `update`.
    pub update_template: PodTemplateSpec,
    /// The revision the set is rolling from (`status.currentRevision`; `update` when the
    /// recorded one is gone or none is recorded yet).
    pub current: String,
    /// The template of `current`.
    pub current_template: PodTemplateSpec,
    /// The write this needs, if any.
    pub write: Option<Write>,
    /// `status.collisionCount`: bumped past names taken by other templates.
    pub collision_count: i32,
}

/// The template a StatefulSet rolls out.
pub fn template(set: &StatefulSet) -> PodTemplateSpec {
    set.spec
        .as_ref()
        .map(|s| s.template.clone())
        .unwrap_or_default()
}

pub use crate::history::{is_same_revision, revision_data, template_of};

/// The name of the revision of `template` with `collision_count`.
pub fn revision_name(set_name: &str, template: &PodTemplateSpec, collision_count: i32) -> String {
    format!(
        "{set_name}-{}",
        crate::deployment::template_hash(template, Some(collision_count))
    )
}

/// A new revision of the set's template numbered `revision`: the template's labels plus the
/// hash label, the set's annotations (so `kubernetes.io/change-cause` reaches `kubectl
/// rollout history`), controlled by the set.
pub fn new_revision(set: &StatefulSet, name: &str, revision: i64) -> ControllerRevision {
    let t = template(set);
    let mut labels = t
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let hash = name
        .strip_prefix(&format!("{}-", set.name()))
        .unwrap_or(name);
    labels.insert(REVISION_LABEL.into(), hash.into());
    let body = json!({
        "apiVersion": "apps/v1",
        "kind": "ControllerRevision",
        "metadata": {
            "name": name,
            "namespace": set.namespace(),
            "labels": labels,
            "annotations": set.metadata.annotations,
            "ownerReferences": [owner_reference(set)],
        },
        "data": revision_data(&t),
        "revision": revision,
    });
    serde_json::from_value(body).unwrap_or_default()
}

/// The set's revisions in history order: by number, then name.
pub fn sorted(revisions: &[&ControllerRevision]) -> Vec<ControllerRevision> {
    crate::history::in_order(revisions)
        .into_iter()
        .cloned()
        .collect()
}

/// Resolves the set's revisions (`revisions`, those it controls): which one is the update
/// revision, which the current one, and what to write (upstream's `getStatefulSetRevisions`).
pub fn resolve(set: &StatefulSet, revisions: &[&ControllerRevision]) -> Resolved {
    let history = sorted(revisions);
    let t = template(set);
    let status = set.status.as_ref();
    let mut collision_count = status.and_then(|s| s.collision_count).unwrap_or(0).max(0);
    let next = history.last().map_or(1, |r| r.revision + 1);
    let equal: Vec<&ControllerRevision> = history
        .iter()
        .filter(|r| template_of(r).as_ref() == Some(&t))
        .collect();
    let (update, write) = match equal.last() {
        Some(latest)
            if latest.metadata.name == history.last().and_then(|r| r.metadata.name.clone()) =>
        {
            (latest.name(), None)
        }
        Some(older) => (
            older.name(),
            Some(Write::Renumber {
                name: older.name(),
                revision: next,
            }),
        ),
        None => {
            // A name taken by another template is a hash collision: probe the next count.
            let mut name = revision_name(&set.name(), &t, collision_count);
            while history.iter().any(|r| r.name() == name) {
                collision_count += 1;
                name = revision_name(&set.name(), &t, collision_count);
            }
            let rev = new_revision(set, &name, next);
            (name, Some(Write::Create(Box::new(rev))))
        }
    };
    let recorded = status.and_then(|s| s.current_revision.clone());
    let current = recorded
        .as_deref()
        .and_then(|n| history.iter().find(|r| r.name() == n))
        .and_then(|r| Some((r.name(), template_of(r)?)));
    let (current, current_template) = match current {
        Some((name, tmpl)) if name != update => (name, tmpl),
        _ => (update.clone(), t.clone()),
    };
    Resolved {
        update,
        update_template: t,
        current,
        current_template,
        write,
        collision_count,
    }
}

/// The revisions to delete: the oldest beyond `revisionHistoryLimit` (default 10) among those
/// no pod is at and that are neither the current nor the update revision.
pub fn truncate(
    set: &StatefulSet,
    revisions: &[&ControllerRevision],
    pods: &[&Pod],
    current: &str,
    update: &str,
) -> Vec<String> {
    let limit = set
        .spec
        .as_ref()
        .and_then(|s| s.revision_history_limit)
        .unwrap_or(10)
        .max(0) as usize;
    let live = |name: &str| {
        name == current || name == update || pods.iter().any(|p| pod_revision(p) == Some(name))
    };
    let idle: Vec<String> = sorted(revisions)
        .into_iter()
        .map(|r| r.name())
        .filter(|n| !live(n))
        .collect();
    let excess = idle.len().saturating_sub(limit);
    idle.into_iter().take(excess).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(image: &str) -> StatefulSet {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "u",
                         "annotations": {"kubernetes.io/change-cause": "why"}},
            "spec": {
                "selector": {"matchLabels": {"app": "web"}},
                "revisionHistoryLimit": 1,
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "c", "image": image}]}
                }
            }
        }))
        .unwrap()
    }

    fn created(r: &Resolved) -> ControllerRevision {
        match &r.write {
            Some(Write::Create(rev)) => (**rev).clone(),
            other => panic!("expected a create, got {other:?}"),
        }
    }

    #[test]
    fn the_first_revision_is_created_and_is_current() {
        let r = resolve(&set("a"), &[]);
        let rev = created(&r);
        assert_eq!(rev.revision, 1);
        assert_eq!(rev.metadata.name.as_deref(), Some(r.update.as_str()));
        assert!(r.update.starts_with("web-"));
        assert_eq!(r.current, r.update);
        let labels = rev.metadata.labels.clone().unwrap();
        assert_eq!(format!("web-{}", labels[REVISION_LABEL]), r.update);
        assert_eq!(
            rev.metadata.annotations.clone().unwrap()["kubernetes.io/change-cause"],
            "why"
        );
        assert_eq!(
            rev.data.as_ref().unwrap().0["spec"]["template"]["$patch"],
            "replace"
        );
        assert_eq!(template_of(&rev), Some(template(&set("a"))));
    }

    #[test]
    fn a_new_template_is_a_new_revision_while_the_old_stays_current() {
        let mut s = set("a");
        let first = created(&resolve(&s, &[]));
        s.status = Some(
            serde_json::from_value(json!({"replicas": 0, "currentRevision": first.name()}))
                .unwrap(),
        );
        let s2 = StatefulSet {
            spec: set("b").spec,
            ..s.clone()
        };
        let r = resolve(&s2, &[&first]);
        let second = created(&r);
        assert_eq!(second.revision, 2);
        assert_eq!(r.current, first.name());
        assert_ne!(r.update, r.current);
        assert_eq!(
            r.current_template.spec.unwrap().containers[0]
                .image
                .as_deref(),
            Some("a")
        );
        // Back to the first template: it is renumbered, not copied.
        let r = resolve(&s, &[&first, &second]);
        assert_eq!(r.update, first.name());
        assert_eq!(
            r.write,
            Some(Write::Renumber {
                name: first.name(),
                revision: 3
            })
        );
        // Already the newest: nothing to write.
        let r = resolve(&s2, &[&first, &second]);
        assert_eq!((r.update, r.write), (second.name(), None));
    }

    #[test]
    fn a_taken_name_bumps_the_collision_count() {
        let s = set("a");
        let mine = created(&resolve(&s, &[]));
        let mut other = new_revision(&set("z"), &mine.name(), 1);
        other.metadata.name = mine.metadata.name.clone();
        let r = resolve(&s, &[&other]);
        assert_eq!(r.collision_count, 1);
        assert_ne!(r.update, mine.name());
        assert_eq!(created(&r).revision, 2);
    }

    #[test]
    fn a_revision_found_by_name_is_ours_only_with_our_template_and_controller() {
        let s = set("a");
        let wanted = created(&resolve(&s, &[]));
        // Made by an earlier attempt whose answer was lost: as the server returns it.
        let mut existing = wanted.clone();
        existing.metadata.uid = Some("r-uid".into());
        existing.metadata.resource_version = Some("42".into());
        assert!(is_same_revision(&existing, &wanted));
        // Another template under the name: a hash collision, not ours.
        let mut other = new_revision(&set("z"), &wanted.name(), 1);
        other.metadata.name = wanted.metadata.name.clone();
        assert!(!is_same_revision(&other, &wanted));
        // Our template, but another set's (a set re-created under the name) or nobody's.
        let mut foreign = existing.clone();
        foreign.metadata.owner_references.as_mut().unwrap()[0].uid = "other".into();
        assert!(!is_same_revision(&foreign, &wanted));
        let mut orphan = existing.clone();
        orphan.metadata.owner_references = None;
        assert!(!is_same_revision(&orphan, &wanted));
        // Being deleted: it will not stay.
        let mut going = existing;
        going.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert!(!is_same_revision(&going, &wanted));
    }

    #[test]
    fn history_keeps_live_revisions_and_the_newest_idle_ones() {
        let s = set("a");
        let revs: Vec<ControllerRevision> = (1..=4)
            .map(|i| new_revision(&s, &format!("web-r{i}"), i))
            .collect();
        let refs: Vec<&ControllerRevision> = revs.iter().collect();
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web-0", "labels": {REVISION_LABEL: "web-r1"}}
        }))
        .unwrap();
        // r1 has a pod, r4 is current and update; of r2 and r3 the limit (1) keeps r3.
        assert_eq!(truncate(&s, &refs, &[&pod], "web-r4", "web-r4"), ["web-r2"]);
    }
}
