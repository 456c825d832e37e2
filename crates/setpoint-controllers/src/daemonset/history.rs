//! Revision history in ControllerRevisions, as upstream's DaemonSet controller keeps it: each
//! distinct pod template is a revision `<ds>-<hash>` (the hash of the template and
//! `status.collisionCount`, the one rule [`crate::deployment::template_hash`]), labelled
//! with the template's labels and `controller-revision-hash`, whose `data` is the patch
//! that puts the template back (`{"spec":{"template":{…,"$patch":"replace"}}}`, what `kubectl
//! rollout undo daemonset/x` applies). The update revision has the highest number; rolling
//! back to an older template renumbers its revision. Old revisions no pod is at are pruned
//! beyond `revisionHistoryLimit` (default 10).

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use serde_json::json;
use setpoint_runtime::Object;

use super::status::{pod_hash, REVISION_LABEL};

pub use crate::history::Write;

/// The update revision of a DaemonSet.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolved {
    /// The hash of the update revision (its pods' `controller-revision-hash`).
    pub hash: String,
    /// The write it needs, if any.
    pub write: Option<Write>,
    /// `status.collisionCount`, bumped past names other templates hold.
    pub collision_count: i32,
}

/// The DaemonSet's pod template.
pub fn template(ds: &DaemonSet) -> PodTemplateSpec {
    ds.spec
        .as_ref()
        .map(|s| s.template.clone())
        .unwrap_or_default()
}

pub use crate::history::{is_same_revision, revision_data, template_of};

/// The hash of the revision of `template` with `collision_count`.
pub fn hash(template: &PodTemplateSpec, collision_count: i32) -> String {
    crate::deployment::template_hash(template, Some(collision_count))
}

/// A new revision of the DaemonSet's template, `<ds>-<hash>`, numbered `revision`: the
/// template's labels plus the hash label, the DaemonSet's annotations (so
/// `kubernetes.io/change-cause` reaches `kubectl rollout history`), controlled by it.
pub fn new_revision(ds: &DaemonSet, hash: &str, revision: i64) -> ControllerRevision {
    let t = template(ds);
    let mut labels = t
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    labels.insert(REVISION_LABEL.into(), hash.into());
    let body = json!({
        "apiVersion": "apps/v1",
        "kind": "ControllerRevision",
        "metadata": {
            "name": format!("{}-{hash}", ds.name()),
            "namespace": ds.namespace(),
            "labels": labels,
            "annotations": ds.metadata.annotations,
            "ownerReferences": [super::owner_reference(ds)],
        },
        "data": revision_data(&t),
        "revision": revision,
    });
    serde_json::from_value(body).unwrap_or_default()
}

use crate::history::in_order as sorted;

/// Resolves the update revision among the DaemonSet's `revisions` (upstream's
/// `constructHistory`): the newest revision with the current template, renumbered to the
/// top if it is not already there, or a new one.
pub fn resolve(ds: &DaemonSet, revisions: &[&ControllerRevision]) -> Resolved {
    let history = sorted(revisions);
    let t = template(ds);
    let mut collision_count = ds
        .status
        .as_ref()
        .and_then(|s| s.collision_count)
        .unwrap_or(0)
        .max(0);
    let top = history.last().map_or(0, |r| r.revision);
    let prefix = format!("{}-", ds.name());
    let hash_of = |r: &ControllerRevision| {
        r.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(REVISION_LABEL).cloned())
            .unwrap_or_else(|| r.name().strip_prefix(&prefix).unwrap_or_default().into())
    };
    match history
        .iter()
        .rev()
        .find(|r| template_of(r).as_ref() == Some(&t))
    {
        Some(rev) => {
            let is_top = history.last().map(|r| r.name()) == Some(rev.name())
                && history.iter().filter(|r| r.revision == top).count() == 1;
            Resolved {
                hash: hash_of(rev),
                write: (!is_top).then(|| Write::Renumber {
                    name: rev.name(),
                    revision: top + 1,
                }),
                collision_count,
            }
        }
        None => {
            // A name another template holds is a hash collision: the next count.
            let mut h = hash(&t, collision_count);
            while history.iter().any(|r| r.name() == format!("{prefix}{h}")) {
                collision_count += 1;
                h = hash(&t, collision_count);
            }
            let rev = new_revision(ds, &h, top + 1);
            Resolved {
                hash: h,
                write: Some(Write::Create(Box::new(rev))),
                collision_count,
            }
        }
    }
}

/// The revisions to delete: the oldest beyond `revisionHistoryLimit` (default 10) among
/// those that are not the update revision (`hash`) and that no pod is at.
pub fn truncate(
    ds: &DaemonSet,
    revisions: &[&ControllerRevision],
    pods: &[&Pod],
    hash: &str,
) -> Vec<String> {
    let limit = ds
        .spec
        .as_ref()
        .and_then(|s| s.revision_history_limit)
        .unwrap_or(10)
        .max(0) as usize;
    let rev_hash = |r: &ControllerRevision| {
        r.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(REVISION_LABEL).cloned())
    };
    let idle: Vec<String> = sorted(revisions)
        .into_iter()
        .filter(|r| {
            let h = rev_hash(r);
            h.as_deref() != Some(hash)
                && !pods
                    .iter()
                    .any(|p| h.is_some() && pod_hash(p) == h.as_deref())
        })
        .map(|r| r.name())
        .collect();
    let excess = idle.len().saturating_sub(limit);
    idle.into_iter().take(excess).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ds(image: &str, collision: Option<i32>) -> DaemonSet {
        serde_json::from_value(json!({
            "metadata": {"name": "agent", "namespace": "default", "uid": "u1"},
            "spec": {
                "selector": {"matchLabels": {"app": "agent"}},
                "revisionHistoryLimit": 1,
                "template": {"metadata": {"labels": {"app": "agent"}},
                             "spec": {"containers": [{"name": "c", "image": image}]}},
            },
            "status": {"collisionCount": collision, "currentNumberScheduled": 0,
                       "numberMisscheduled": 0, "desiredNumberScheduled": 0, "numberReady": 0},
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
    fn a_new_template_gets_the_next_revision_and_a_rollback_renumbers() {
        let v1 = ds("a:1", None);
        let r1 = resolve(&v1, &[]);
        let rev1 = created(&r1);
        assert_eq!(
            rev1.metadata.name.as_deref(),
            Some(format!("agent-{}", r1.hash).as_str())
        );
        assert_eq!(rev1.revision, 1);
        assert_eq!(
            rev1.metadata.labels.as_ref().unwrap()[REVISION_LABEL],
            r1.hash
        );
        assert_eq!(rev1.metadata.labels.as_ref().unwrap()["app"], "agent");
        assert_eq!(template_of(&rev1), Some(template(&v1)));
        assert_eq!(
            rev1.data.as_ref().unwrap().0["spec"]["template"]["$patch"],
            "replace"
        );

        assert_eq!(
            resolve(&v1, &[&rev1]).write,
            None,
            "steady state writes nothing"
        );

        let v2 = ds("a:2", None);
        let rev2 = created(&resolve(&v2, &[&rev1]));
        assert_eq!(rev2.revision, 2);
        let back = resolve(&v1, &[&rev1, &rev2]);
        assert_eq!(back.hash, r1.hash);
        assert_eq!(
            back.write,
            Some(Write::Renumber {
                name: rev1.name(),
                revision: 3
            })
        );
    }

    #[test]
    fn a_taken_name_bumps_the_collision_count() {
        let v1 = ds("a:1", None);
        let r1 = resolve(&v1, &[]);
        // Another template under the name v1 would get.
        let mut squatter = new_revision(&ds("other", None), &r1.hash, 1);
        squatter.metadata.name = Some(format!("agent-{}", r1.hash));
        let r = resolve(&v1, &[&squatter]);
        assert_eq!(r.collision_count, 1);
        assert_ne!(r.hash, r1.hash);
        assert_eq!(created(&r).revision, 2);
    }

    #[test]
    fn truncation_keeps_live_revisions_and_the_limit() {
        let revs: Vec<ControllerRevision> = (1..=4)
            .map(|i| new_revision(&ds(&format!("a:{i}"), None), &format!("h{i}"), i))
            .collect();
        let refs: Vec<&ControllerRevision> = revs.iter().collect();
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p",
            "labels": {REVISION_LABEL: "h1"}}}))
        .unwrap();
        // h4 is the update revision, h1 has a pod; of h2 and h3 one may stay.
        assert_eq!(
            truncate(&ds("a:4", None), &refs, &[&pod], "h4"),
            vec!["agent-h2".to_string()]
        );
    }
}
