//! The `Recreate` strategy: every old ReplicaSet goes to zero, and the new one is scaled up
//! only once their pods are gone, so pods of two templates never run side by side.

use k8s_openapi::api::apps::v1::Deployment;

use super::pass::Pass;

/// Whether the Deployment's strategy is `Recreate` (otherwise it is a rolling update).
pub(super) fn is_recreate(d: &Deployment) -> bool {
    d.spec
        .as_ref()
        .and_then(|s| s.strategy.as_ref())
        .and_then(|s| s.type_.as_deref())
        == Some("Recreate")
}

/// One recreate step: the old ReplicaSets to 0, and the new one to `replicas` when none of
/// them reports a pod any more (their status, not their spec, says the pods are gone).
pub(super) fn rollout(p: &mut Pass) {
    let Some(n) = p.new_idx else {
        return;
    };
    let mut olds_running = false;
    for i in p.olds() {
        p.scale(i, 0);
        olds_running |= p.views[i].pods > 0;
    }
    if !olds_running {
        p.scale(n, p.replicas);
    }
}

#[cfg(test)]
mod tests {
    use super::super::pass::spec_replicas;
    use super::super::plan;
    use super::super::testing::*;
    use serde_json::json;

    #[test]
    fn recreate_waits_for_old_pods_to_go() {
        let mut d = deployment(2, "a", json!({"type": "Recreate"}));
        let mut m = Model::default();
        m.settle(&mut d);
        set_image(&mut d, "b");
        // Old pods still running in the RS status: the new RS stays at 0.
        let p = plan(&d, &m.rses, &at(0));
        let created = p.create.as_ref().unwrap();
        assert_eq!(spec_replicas(created), 0);
        assert_eq!(p.updates[0].replicas, 0);
        m.settle(&mut d);
        assert_eq!(spec_replicas(m.by_rev("2")), 2);
        assert_eq!(spec_replicas(m.by_rev("1")), 0);
    }
}
