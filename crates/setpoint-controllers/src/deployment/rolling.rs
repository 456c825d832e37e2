//! The `RollingUpdate` strategy: the new ReplicaSet grows while the pods stay within
//! `replicas + maxSurge`, and the old ones shrink while availability stays at or above
//! `replicas - maxUnavailable`. Each pass moves as far as both bounds allow; the next pass
//! comes with the next change of pod status.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::pass::{desired, Pass};
use super::recreate::is_recreate;

/// A `maxSurge` or `maxUnavailable` value against `total` replicas: a count, or a
/// percentage rounded up (surge) or down (unavailable) as Kubernetes rounds them.
pub(crate) fn resolve(v: Option<&IntOrString>, total: i32, round_up: bool, default: &str) -> i32 {
    match v
        .cloned()
        .unwrap_or_else(|| IntOrString::String(default.into()))
    {
        IntOrString::Int(i) => i.max(0),
        IntOrString::String(s) => {
            let p: i64 = s.trim_end_matches('%').parse().unwrap_or(0);
            let n = i64::from(total) * p;
            (if round_up { (n + 99) / 100 } else { n / 100 }) as i32
        }
    }
}

/// `(maxSurge, maxUnavailable)` resolved against the desired replicas; both 0 → 1 unavailable.
pub fn surge_and_unavailable(d: &Deployment) -> (i32, i32) {
    let spec = d.spec.as_ref();
    if is_recreate(d) {
        return (0, 0);
    }
    let replicas = desired(d);
    let ru = spec
        .and_then(|s| s.strategy.as_ref())
        .and_then(|s| s.rolling_update.as_ref());
    let surge = resolve(ru.and_then(|r| r.max_surge.as_ref()), replicas, true, "25%");
    let unavailable = resolve(
        ru.and_then(|r| r.max_unavailable.as_ref()),
        replicas,
        false,
        "25%",
    );
    // Both 0 could never make progress: nothing may be added and nothing taken away.
    if surge == 0 && unavailable == 0 {
        (0, 1)
    } else {
        (surge, unavailable)
    }
}

/// One rolling step: the new ReplicaSet up, then the old ones down.
pub(super) fn rollout(p: &mut Pass) {
    let Some(n) = p.new_idx else {
        return;
    };
    scale_up_new(p, n);
    scale_down_old(p, n);
}

/// Scales the new ReplicaSet `n` towards `replicas`, within the surge over the pods that
/// may exist (down at once, should it have more).
fn scale_up_new(p: &mut Pass, n: usize) {
    let replicas = p.replicas;
    let cur = p.views[n].replicas;
    if cur > replicas {
        p.scale(n, replicas);
    } else if cur < replicas {
        let room = replicas + p.surge - p.occupied();
        if room > 0 {
            let to = cur + room.min(replicas - cur);
            p.scale(n, to);
        }
    }
}

/// Scales the old ReplicaSets down, oldest first, keeping `replicas - maxUnavailable`
/// available and not counting on the new ReplicaSet's pods that are not available yet.
fn scale_down_old(p: &mut Pass, n: usize) {
    let olds = p.olds();
    let min_available = p.replicas - p.max_unavailable;
    let new_unavailable = (p.views[n].replicas - p.views[n].available).max(0);
    let mut budget = p.total() - min_available - new_unavailable;
    // First, unavailable old replicas cost nothing to remove.
    for &i in &olds {
        if budget <= 0 {
            break;
        }
        let unhealthy = (p.views[i].replicas - p.views[i].available).max(0);
        let cut = unhealthy.min(budget);
        if cut > 0 {
            let to = p.views[i].replicas - cut;
            p.scale(i, to);
            budget -= cut;
        }
    }
    // Then available ones, as far as availability allows.
    let available: i32 = p.views.iter().map(|v| v.available.min(v.replicas)).sum();
    let mut can = (available - min_available).min(budget.max(0));
    for &i in &olds {
        if can <= 0 {
            break;
        }
        let cut = p.views[i].replicas.min(can);
        if cut > 0 {
            let to = p.views[i].replicas - cut;
            p.scale(i, to);
            can -= cut;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::pass::{annotation, spec_replicas};
    use super::super::testing::*;
    use super::super::{plan, REVISION};
    use super::*;
    use serde_json::json;

    #[test]
    fn resolve_rounds_surge_up_and_unavailable_down() {
        let pct = IntOrString::String("25%".into());
        assert_eq!(resolve(Some(&pct), 5, true, "0%"), 2);
        assert_eq!(resolve(Some(&pct), 5, false, "0%"), 1);
        assert_eq!(resolve(Some(&IntOrString::Int(-3)), 5, true, "0%"), 0);
        assert_eq!(resolve(None, 8, false, "25%"), 2);
    }

    #[test]
    fn surge_and_unavailable_round_as_kubernetes_does() {
        let d = deployment(10, "a", rolling(json!("25%"), json!("25%")));
        assert_eq!(surge_and_unavailable(&d), (3, 2));
        let d = deployment(3, "a", rolling(json!(0), json!(0)));
        assert_eq!(surge_and_unavailable(&d), (0, 1));
        let d = deployment(3, "a", rolling(json!(1), json!(0)));
        assert_eq!(surge_and_unavailable(&d), (1, 0));
    }

    #[test]
    fn rolling_update_respects_surge_and_completes() {
        let mut d = deployment(3, "a", rolling(json!(1), json!(0)));
        let mut m = Model::default();
        m.settle(&mut d);
        assert_eq!(
            progressing(&d).reason.as_deref(),
            Some("NewReplicaSetAvailable")
        );
        set_image(&mut d, "b");
        let p = m.step(&mut d);
        assert!(p.create.is_some());
        assert_eq!(m.total(), 4);
        assert_eq!(m.by_rev("1").spec.as_ref().unwrap().replicas, Some(3));
        m.step(&mut d);
        assert_eq!(
            m.total(),
            4,
            "nothing scales down before new pods are available"
        );
        m.ready(1);
        let p = m.step(&mut d);
        assert!(p
            .events
            .iter()
            .any(|e| e.starts_with("Scaled down replica set")));
        assert!(m.available() >= 3);
        m.settle(&mut d);
        assert_eq!(m.by_rev("1").spec.as_ref().unwrap().replicas, Some(0));
        assert_eq!(m.by_rev("2").spec.as_ref().unwrap().replicas, Some(3));
        let st = d.status.as_ref().unwrap();
        assert_eq!(st.observed_generation, Some(2));
        assert_eq!(
            (st.updated_replicas, st.available_replicas),
            (Some(3), Some(3))
        );
        assert_eq!(
            progressing(&d).reason.as_deref(),
            Some("NewReplicaSetAvailable")
        );
        assert_eq!(d.metadata.annotations.as_ref().unwrap()[REVISION], "2");
    }

    #[test]
    fn surge_counts_pods_an_old_replica_set_still_has() {
        let mut d = deployment(3, "a", rolling(json!(1), json!(0)));
        let mut m = Model::default();
        m.settle(&mut d);
        set_image(&mut d, "b");
        m.step(&mut d);
        m.ready(1);
        // The old ReplicaSet is scaled down to 2 in this pass...
        m.step(&mut d);
        assert_eq!(spec_replicas(m.by_rev("1")), 2);
        // ...but its controller has not removed the third pod yet.
        let old = m
            .rses
            .iter_mut()
            .find(|r| annotation(&r.metadata, REVISION) == Some("1"))
            .unwrap();
        old.status.as_mut().unwrap().replicas = 3;
        let new_before = spec_replicas(m.by_rev("2"));
        let p = plan(&d, &m.rses, &at(m.clock));
        let grown = p.updates.iter().any(|u| {
            u.name == m.by_rev("2").metadata.name.clone().unwrap() && u.replicas > new_before
        });
        assert!(!grown, "no new pod while 4 already exist: {:?}", p.updates);
    }
}
