//! The ReplicaSet of the current pod template: the first step of every pass.
//!
//! It is found by comparing templates (the `pod-template-hash` label aside), so going back to
//! an earlier template — a rollback — finds that template's old ReplicaSet again rather than
//! making another. When there is none, one is created (never while paused), named after a
//! hash of the template; a name already taken by a different template is a hash collision,
//! and the collision count that goes into the next hash is bumped.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, ReplicaSetSpec};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::Resource as _;

use super::history;
use super::pass::{annotation, Pass, Rs};
use super::{CHANGE_CAUSE, HASH_LABEL, REVISION};

/// A stable short hash of a pod template (and the collision count), rendered in the
/// alphabet Kubernetes uses for safe names (no vowels, no look-alike digits).
pub fn template_hash(template: &PodTemplateSpec, collision_count: Option<i32>) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut t = template.clone();
    if let Some(l) = t.metadata.as_mut().and_then(|m| m.labels.as_mut()) {
        l.remove(HASH_LABEL);
    }
    let canonical = serde_json::to_vec(&t).unwrap_or_default();
    // 32-bit FNV-1a.
    let mut h: u32 = 0x811c_9dc5;
    let mut feed = |bytes: &[u8]| {
        for b in bytes {
            h ^= u32::from(*b);
            h = h.wrapping_mul(0x0100_0193);
        }
    };
    feed(&canonical);
    if let Some(c) = collision_count {
        feed(&c.to_le_bytes());
    }
    h.to_string()
        .bytes()
        .map(|d| ALPHABET[usize::from(d) % ALPHABET.len()] as char)
        .collect()
}

/// The template without the `pod-template-hash` label, for comparing templates.
pub(super) fn bare(t: Option<&PodTemplateSpec>) -> serde_json::Value {
    let mut t = t.cloned().unwrap_or_default();
    if let Some(m) = t.metadata.as_mut() {
        if let Some(l) = m.labels.as_mut() {
            l.remove(HASH_LABEL);
            if l.is_empty() {
                m.labels = None;
            }
        }
    }
    serde_json::to_value(t).unwrap_or_default()
}

/// Sets the pass's new ReplicaSet: the oldest one with the Deployment's template, brought up
/// to the newest revision, or else a new view to create (`created`). Either way it records
/// why the rollout progressed, when it did.
pub(super) fn find_or_create_new(p: &mut Pass) {
    let wanted = bare(Some(&p.spec.template));
    p.new_idx = p
        .order
        .iter()
        .copied()
        .find(|&i| bare(p.rses[i].spec.as_ref().and_then(|s| s.template.as_ref())) == wanted);
    let revision = history::next_revision(&p.views, p.new_idx);
    if let Some(i) = p.new_idx {
        adopt_existing(p, i, revision);
    } else if !p.paused {
        add_new(p, revision);
    }
}

/// Brings an existing ReplicaSet of the current template up to date: the next revision if
/// it is behind another (a rollback to it), and the Deployment's change cause.
fn adopt_existing(p: &mut Pass, i: usize, revision: i64) {
    let v = &mut p.views[i];
    if v.revision < revision {
        v.annotations.insert(REVISION.into(), revision.to_string());
        v.revision = revision;
        v.changed = true;
    }
    if let Some(cc) = annotation(&p.d.metadata, CHANGE_CAUSE) {
        if v.annotations.get(CHANGE_CAUSE).map(String::as_str) != Some(cc) {
            v.annotations.insert(CHANGE_CAUSE.into(), cc.into());
            v.changed = true;
        }
    }
    // Said only while there is no Progressing condition yet: a reason counts as progress,
    // and saying it on every pass would renew the progress deadline forever.
    if p.old_status
        .conditions
        .as_ref()
        .is_none_or(|c| !c.iter().any(|c| c.type_ == "Progressing"))
    {
        p.progress = Some((
            "FoundNewReplicaSet",
            format!("Found new replica set \"{}\"", v.name),
        ));
    }
}

/// Adds the view of a ReplicaSet to create, at 0 replicas (the strategy scales it), unless
/// its name is taken even after bumping the collision count: then the bumped count goes out
/// with the status and the next pass tries the next hash.
fn add_new(p: &mut Pass, revision: i64) {
    let name = p.d.metadata.name.clone().unwrap_or_default();
    let mut hash = template_hash(&p.spec.template, p.collision_count);
    let mut rs_name = format!("{name}-{hash}");
    if p.views.iter().any(|v| v.name == rs_name) {
        // Same name, different template (the same one would have been found): a collision.
        p.collision_count = Some(p.collision_count.unwrap_or(0) + 1);
        hash = template_hash(&p.spec.template, p.collision_count);
        rs_name = format!("{name}-{hash}");
    }
    if p.views.iter().any(|v| v.name == rs_name) {
        return;
    }
    let mut annotations = BTreeMap::new();
    annotations.insert(REVISION.to_string(), revision.to_string());
    if let Some(cc) = annotation(&p.d.metadata, CHANGE_CAUSE) {
        annotations.insert(CHANGE_CAUSE.into(), cc.into());
    }
    p.views.push(Rs {
        name: rs_name.clone(),
        replicas: 0,
        pods: 0,
        available: 0,
        annotations,
        changed: true,
        created: i64::MAX,
        revision,
    });
    p.new_idx = Some(p.views.len() - 1);
    p.order.push(p.views.len() - 1);
    p.created = true;
    p.progress = Some((
        "NewReplicaSetCreated",
        format!("Created new replica set \"{rs_name}\""),
    ));
}

/// The ReplicaSet object to create for view `v`: the Deployment's template and selector,
/// both narrowed by the hash label, owned by the Deployment.
pub(super) fn new_replica_set(d: &Deployment, v: &Rs, collision_count: &Option<i32>) -> ReplicaSet {
    let spec = d.spec.clone().unwrap_or_default();
    let hash = template_hash(&spec.template, *collision_count);
    let mut template = spec.template.clone();
    let meta = template.metadata.get_or_insert_with(Default::default);
    meta.labels
        .get_or_insert_with(Default::default)
        .insert(HASH_LABEL.into(), hash.clone());
    let mut selector = spec.selector.clone();
    selector
        .match_labels
        .get_or_insert_with(Default::default)
        .insert(HASH_LABEL.into(), hash.clone());
    let mut labels = spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    labels.insert(HASH_LABEL.into(), hash);
    ReplicaSet {
        metadata: ObjectMeta {
            name: Some(v.name.clone()),
            namespace: d.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: Some(v.annotations.clone()),
            owner_references: Some(vec![owner_reference(d)]),
            ..Default::default()
        },
        spec: Some(ReplicaSetSpec {
            replicas: Some(v.replicas),
            min_ready_seconds: spec.min_ready_seconds,
            selector,
            template: Some(template),
        }),
        status: None,
    }
}

/// The controller reference a Deployment's ReplicaSets carry.
pub(super) fn owner_reference(d: &Deployment) -> OwnerReference {
    OwnerReference {
        api_version: Deployment::API_VERSION.into(),
        kind: Deployment::KIND.into(),
        name: d.metadata.name.clone().unwrap_or_default(),
        uid: d.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::{plan, DESIRED_REPLICAS, MAX_REPLICAS};
    use super::*;
    use serde_json::json;

    #[test]
    fn hash_is_stable_short_and_safe() {
        let d = deployment(1, "a", json!({}));
        let t = &d.spec.as_ref().unwrap().template;
        let h = template_hash(t, None);
        assert_eq!(h, template_hash(t, None));
        assert!(
            h.len() <= 10
                && h.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        );
        assert_ne!(h, template_hash(t, Some(1)));
        let other = deployment(1, "b", json!({}));
        assert_ne!(
            h,
            template_hash(&other.spec.as_ref().unwrap().template, None)
        );
    }

    #[test]
    fn first_pass_creates_a_labelled_owned_replica_set() {
        let d = deployment(3, "a", json!({}));
        let p = plan(&d, &[], &at(0));
        let rs = p.create.unwrap();
        let hash = template_hash(&d.spec.as_ref().unwrap().template, None);
        assert_eq!(
            rs.metadata.name.as_deref(),
            Some(format!("app-{hash}").as_str())
        );
        assert_eq!(rs.metadata.labels.as_ref().unwrap()[HASH_LABEL], hash);
        let spec = rs.spec.as_ref().unwrap();
        assert_eq!(
            spec.selector.match_labels.as_ref().unwrap()[HASH_LABEL],
            hash
        );
        let tl = spec.template.as_ref().unwrap().metadata.as_ref().unwrap();
        assert_eq!(tl.labels.as_ref().unwrap()[HASH_LABEL], hash);
        assert_eq!(spec.replicas, Some(3));
        let a = rs.metadata.annotations.as_ref().unwrap();
        assert_eq!(a[REVISION], "1");
        assert_eq!(a[DESIRED_REPLICAS], "3");
        assert_eq!(a[MAX_REPLICAS], "4");
        let owner = &rs.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.uid.as_str(), owner.controller),
            ("d-uid", Some(true))
        );
        assert_eq!(p.revision.as_deref(), Some("1"));
        assert_eq!(
            progressing(&Deployment {
                status: p.status,
                ..d
            })
            .reason
            .as_deref(),
            Some("NewReplicaSetCreated")
        );
    }

    #[test]
    fn collision_bumps_the_count_and_rehashes() {
        let d = deployment(1, "a", json!({}));
        let hash = template_hash(&d.spec.as_ref().unwrap().template, None);
        let mut squatter = plan(&deployment(1, "zzz", json!({})), &[], &at(0))
            .create
            .unwrap();
        squatter.metadata.name = Some(format!("app-{hash}"));
        let p = plan(&d, &[squatter], &at(0));
        assert_eq!(p.status.as_ref().unwrap().collision_count, Some(1));
        let created = p.create.unwrap();
        assert_eq!(
            created.metadata.name.unwrap(),
            format!(
                "app-{}",
                template_hash(&d.spec.as_ref().unwrap().template, Some(1))
            )
        );
    }

    #[test]
    fn the_hash_label_does_not_make_a_template_different() {
        let d = deployment(1, "a", json!({}));
        let mut labelled = d.spec.as_ref().unwrap().template.clone();
        labelled
            .metadata
            .as_mut()
            .unwrap()
            .labels
            .as_mut()
            .unwrap()
            .insert(HASH_LABEL.into(), "x".into());
        let plain = &d.spec.as_ref().unwrap().template;
        assert_eq!(bare(Some(&labelled)), bare(Some(plain)));
        assert_eq!(template_hash(&labelled, None), template_hash(plain, None));
    }
}
