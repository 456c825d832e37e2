//! Revision history: the `deployment.kubernetes.io/revision` annotation numbers a
//! Deployment's templates in the order they were rolled out, and old ReplicaSets beyond
//! `revisionHistoryLimit` are deleted.
//!
//! A rollback needs nothing of its own: the earlier template's ReplicaSet is found again
//! (`sync`) and takes the next number, so revisions only ever grow and `kubectl rollout
//! history` lists templates in the order they were last rolled out.

use super::pass::{Pass, Rs};

/// The revision the current template's ReplicaSet should carry: one past every other
/// ReplicaSet's (1 for the first).
pub(super) fn next_revision(views: &[Rs], new_idx: Option<usize>) -> i64 {
    let max_old = views
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != new_idx)
        .map(|(_, v)| v.revision)
        .max()
        .unwrap_or(0);
    max_old + 1
}

/// The old ReplicaSets to delete: the oldest idle ones (no replicas and no pods left) beyond
/// `revisionHistoryLimit` of them. Without a limit, none: every revision is kept.
pub(super) fn cleanup(p: &Pass) -> Vec<String> {
    let Some(limit) = p.spec.revision_history_limit else {
        return Vec::new();
    };
    // A ReplicaSet still holding pods is not history yet: deleting it would cascade to
    // pods a scale-down has not removed.
    let idle: Vec<usize> = p
        .olds()
        .into_iter()
        .filter(|&i| p.views[i].replicas == 0 && p.views[i].pods == 0)
        .collect();
    let excess = idle.len().saturating_sub(limit.max(0) as usize);
    idle.iter()
        .take(excess)
        .map(|&i| p.views[i].name.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::pass::spec_replicas;
    use super::super::testing::*;
    use super::*;
    use serde_json::json;
    use std::collections::BTreeMap;

    fn view(revision: i64) -> Rs {
        Rs {
            name: format!("rs-{revision}"),
            replicas: 0,
            pods: 0,
            available: 0,
            annotations: BTreeMap::new(),
            changed: false,
            created: revision,
            revision,
        }
    }

    #[test]
    fn next_revision_is_one_past_the_others() {
        assert_eq!(next_revision(&[], None), 1);
        let views = [view(1), view(4), view(2)];
        assert_eq!(next_revision(&views, None), 5);
        // The current template's own number does not count: already the newest, it stays
        // (3 < 4); an older one, rolled back to, moves up to 5.
        assert_eq!(next_revision(&views, Some(1)), 3);
        assert_eq!(next_revision(&views, Some(0)), 5);
    }

    #[test]
    fn history_limit_deletes_the_oldest_idle_replica_sets() {
        let mut d = deployment(1, "a", rolling(json!(1), json!(0)));
        d.spec.as_mut().unwrap().revision_history_limit = Some(1);
        let mut m = Model::default();
        for image in ["a", "b", "c", "d"] {
            set_image(&mut d, image);
            m.settle(&mut d);
        }
        assert_eq!(m.rses.len(), 2);
        assert_eq!(spec_replicas(m.by_rev("4")), 1);
        assert_eq!(spec_replicas(m.by_rev("3")), 0);
    }

    #[test]
    fn rollback_reuses_the_old_replica_set_with_a_new_revision() {
        let mut d = deployment(2, "a", rolling(json!(1), json!(0)));
        let mut m = Model::default();
        m.settle(&mut d);
        set_image(&mut d, "b");
        m.settle(&mut d);
        set_image(&mut d, "a");
        m.settle(&mut d);
        assert_eq!(m.rses.len(), 2);
        let rs = m.by_rev("3");
        assert_eq!(spec_replicas(rs), 2);
        assert_eq!(
            rs.spec
                .as_ref()
                .unwrap()
                .template
                .as_ref()
                .unwrap()
                .spec
                .as_ref()
                .unwrap()
                .containers[0]
                .image
                .as_deref(),
            Some("a")
        );
        assert_eq!(spec_replicas(m.by_rev("2")), 0);
    }
}
