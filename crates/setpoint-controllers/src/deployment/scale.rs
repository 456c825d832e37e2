//! Scaling that makes no rollout progress: a changed `spec.replicas` while several
//! ReplicaSets are active, a paused Deployment, and the annotations that let the next pass
//! tell the two apart from a rollout.
//!
//! Spreading a new count over the active ReplicaSets in proportion to their size keeps a
//! rollout under way in the same shape — the same share of old and new pods — instead of
//! growing or shrinking only one of them.

use std::collections::BTreeMap;

use super::pass::{Pass, Rs};
use super::recreate::is_recreate;
use super::{DESIRED_REPLICAS, MAX_REPLICAS};

/// The `spec.replicas` a ReplicaSet was last scaled for, as it recorded it.
fn recorded_replicas(v: &Rs) -> Option<i32> {
    v.annotations
        .get(DESIRED_REPLICAS)
        .and_then(|r| r.parse::<i32>().ok())
}

/// Scales the active ReplicaSets of a rolling Deployment in proportion when `spec.replicas`
/// differs from what one of them was scaled for and more than one is active, so that
/// together they come to `replicas + maxSurge`. Returns whether anything was scaled; when
/// so, the pass makes no rollout progress.
pub(super) fn proportionally(p: &mut Pass) -> bool {
    let replicas = p.replicas;
    let active = p.active();
    let scaling_event = active
        .iter()
        .any(|&i| recorded_replicas(&p.views[i]).is_some_and(|r| r != replicas));
    if !scaling_event || active.len() <= 1 || is_recreate(p.d) {
        return false;
    }
    let to_add = replicas + p.surge - p.total();
    if to_add == 0 {
        return false;
    }
    let mut by_size = active;
    // Biggest first (newer first among equals when growing, older first when shrinking);
    // the rounding leftover goes to the first.
    let sign = if to_add > 0 { -1 } else { 1 };
    by_size.sort_by_key(|&i| (-p.views[i].replicas, sign * p.views[i].created));
    let mut added = 0;
    let mut sizes: BTreeMap<usize, i32> = BTreeMap::new();
    for &i in &by_size {
        let v = &p.views[i];
        let was = recorded_replicas(v)
            .filter(|r| *r > 0)
            .unwrap_or(replicas.max(1));
        let target = (f64::from(v.replicas) * f64::from(replicas) / f64::from(was)).round() as i32;
        let mut delta = target - v.replicas;
        let remaining = to_add - added;
        delta = if to_add > 0 {
            delta.clamp(0, remaining)
        } else {
            delta.clamp(remaining, 0)
        };
        added += delta;
        sizes.insert(i, v.replicas + delta);
    }
    if let Some(&first) = by_size.first() {
        let s = sizes.entry(first).or_default();
        *s = (*s + to_add - added).max(0);
    }
    for (i, n) in sizes {
        p.scale(i, n);
    }
    true
}

/// A paused Deployment: no rollout, only scaling — a lone active ReplicaSet (or the new one,
/// when none is active) follows `spec.replicas`. Several active ones (a rollout paused
/// midway) keep their sizes; only a changed `spec.replicas` resizes them, in
/// [`proportionally`].
pub(super) fn paused(p: &mut Pass) {
    let active = p.active();
    if active.len() <= 1 {
        if let Some(t) = active.first().copied().or(p.new_idx) {
            p.scale(t, p.replicas);
        }
    }
}

/// Records on every ReplicaSet with replicas, and on the new one, the `spec.replicas` (and
/// that plus `maxSurge`) it is now scaled for: a later pass that finds a different count
/// knows `spec.replicas` changed, as opposed to a rollout moving pods between them.
pub(super) fn record_targets(p: &mut Pass) {
    let (replicas, surge, new_idx) = (p.replicas, p.surge, p.new_idx);
    for (i, v) in p.views.iter_mut().enumerate() {
        if v.replicas > 0 || Some(i) == new_idx {
            for (k, val) in [
                (DESIRED_REPLICAS, replicas),
                (MAX_REPLICAS, replicas + surge),
            ] {
                let val = val.to_string();
                if v.annotations.get(k) != Some(&val) {
                    v.annotations.insert(k.into(), val);
                    v.changed = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::pass::spec_replicas;
    use super::super::testing::*;
    use serde_json::json;

    #[test]
    fn paused_makes_no_progress_but_scales() {
        let mut d = deployment(2, "a", rolling(json!(1), json!(0)));
        let mut m = Model::default();
        m.settle(&mut d);
        d.spec.as_mut().unwrap().paused = Some(true);
        set_image(&mut d, "b");
        m.settle(&mut d);
        assert_eq!(m.rses.len(), 1);
        assert_eq!(progressing(&d).reason.as_deref(), Some("DeploymentPaused"));
        d.spec.as_mut().unwrap().replicas = Some(4);
        m.settle(&mut d);
        assert_eq!(spec_replicas(m.by_rev("1")), 4);
        d.spec.as_mut().unwrap().paused = None;
        m.settle(&mut d);
        assert_eq!(spec_replicas(m.by_rev("2")), 4);
        assert_eq!(spec_replicas(m.by_rev("1")), 0);
    }

    #[test]
    fn proportional_scaling_mid_rollout() {
        let mut d = deployment(10, "a", rolling(json!(3), json!(2)));
        let mut m = Model::default();
        m.settle(&mut d);
        set_image(&mut d, "b");
        m.step(&mut d);
        // new 3 (surge), old scaled to 8 (10 - 2 unavailable).
        assert_eq!(
            (spec_replicas(m.by_rev("2")), spec_replicas(m.by_rev("1"))),
            (3, 8)
        );
        d.spec.as_mut().unwrap().replicas = Some(20);
        let p = m.step(&mut d);
        assert!(!p.events.is_empty());
        // Scaled to 20 + 3 surge in proportion: 8 → 16 (+1 rounding leftover to the largest), 3 → 6.
        assert_eq!(m.total(), 20 + 3);
        assert_eq!(
            (spec_replicas(m.by_rev("2")), spec_replicas(m.by_rev("1"))),
            (6, 17)
        );
    }
}
