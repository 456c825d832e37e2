//! The status a pass reports: replica counts summed from what the ReplicaSets report, the
//! `Available` condition, and the `Progressing` condition with its deadline.
//!
//! `Progressing` is renewed whenever the rollout moved (a ReplicaSet found, created or
//! scaled, or any count changed); a rollout that has not moved for
//! `progressDeadlineSeconds` is reported as `ProgressDeadlineExceeded`. Nothing else would
//! bring the Deployment back at the deadline, so the pass asks to be requeued then.

use std::time::Duration;

use k8s_openapi::api::apps::v1::{DeploymentCondition, DeploymentStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::pass::{secs, status_of, Pass};

/// A condition that changes at `now`.
fn condition(
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    now: &Time,
) -> DeploymentCondition {
    DeploymentCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message),
        last_update_time: Some(now.clone()),
        last_transition_time: Some(now.clone()),
    }
}

/// Sets `c` in `conds`, keeping the transition time when the status is unchanged and the
/// update time too when nothing at all changed.
fn set_condition(conds: &mut Vec<DeploymentCondition>, mut c: DeploymentCondition) {
    if let Some(old) = conds.iter().find(|o| o.type_ == c.type_) {
        if old.status == c.status {
            c.last_transition_time = old.last_transition_time.clone();
            if old.reason == c.reason && old.message == c.message {
                c.last_update_time = old.last_update_time.clone();
            }
        }
    }
    conds.retain(|o| o.type_ != c.type_);
    conds.push(c);
}

/// The status to write (`None` when it is what the Deployment already has) and when to look
/// again for the progress deadline.
pub(super) fn status(p: &Pass, now: &Time) -> (Option<DeploymentStatus>, Option<Duration>) {
    let mut st = counts(p);
    let mut conds = p.old_status.conditions.clone().unwrap_or_default();
    let available = st.available_replicas.unwrap_or(0);
    let min_available = p.replicas - p.max_unavailable;
    set_condition(
        &mut conds,
        if available >= min_available {
            condition(
                "Available",
                "True",
                "MinimumReplicasAvailable",
                "Deployment has minimum availability.".into(),
                now,
            )
        } else {
            condition(
                "Available",
                "False",
                "MinimumReplicasUnavailable",
                "Deployment does not have minimum availability.".into(),
                now,
            )
        },
    );
    let requeue = set_progressing(p, &st, &mut conds, now);
    conds.sort_by_key(|c| if c.type_ == "Available" { 0 } else { 1 });
    st.conditions = Some(conds);
    let changed = (Some(&st) != p.d.status.as_ref()).then_some(st);
    (changed, requeue)
}

/// The counts, from what the ReplicaSets report (not from what this pass decided, which
/// their pods have yet to follow).
fn counts(p: &Pass) -> DeploymentStatus {
    let (mut pods, mut ready, mut available) = (0, 0, 0);
    for rs in p.rses {
        let (p, r, a) = status_of(rs);
        pods += p;
        ready += r;
        available += a;
    }
    let updated = p
        .new_idx
        .and_then(|n| p.rses.get(n))
        .map_or(0, |rs| status_of(rs).0);
    DeploymentStatus {
        observed_generation: p.d.metadata.generation,
        collision_count: p.collision_count,
        replicas: Some(pods),
        updated_replicas: Some(updated),
        ready_replicas: Some(ready),
        available_replicas: Some(available),
        // As Kubernetes counts it: the ReplicaSets' desired pods not yet available.
        unavailable_replicas: Some((p.total() - available).max(0)),
        ..Default::default()
    }
}

/// Sets the `Progressing` condition for status `st`; returns when to look again if the
/// deadline is still running.
fn set_progressing(
    p: &Pass,
    st: &DeploymentStatus,
    conds: &mut Vec<DeploymentCondition>,
    now: &Time,
) -> Option<Duration> {
    let replicas = p.replicas;
    let new_name = p
        .new_idx
        .map(|n| p.views[n].name.clone())
        .unwrap_or_default();
    // Scaling in this pass is progress too, when nothing more specific was found.
    let reason = p.progress.clone().or_else(|| {
        let n = p.new_idx.filter(|_| !p.events.is_empty())?;
        Some((
            "ReplicaSetUpdated",
            format!("ReplicaSet \"{}\" is progressing.", p.views[n].name),
        ))
    });
    let (pods, updated, available) = (
        st.replicas.unwrap_or(0),
        st.updated_replicas.unwrap_or(0),
        st.available_replicas.unwrap_or(0),
    );
    let complete = p.new_idx.is_some_and(|n| p.views[n].replicas == replicas)
        && updated == replicas
        && pods == replicas
        && available == replicas
        && p.olds().iter().all(|&i| p.views[i].replicas == 0);
    let deadline = p.spec.progress_deadline_seconds.unwrap_or(600);
    let old = &p.old_status;
    let progressed = reason.is_some()
        || old.replicas != st.replicas
        || old.updated_replicas != st.updated_replicas
        || old.ready_replicas != st.ready_replicas
        || old.available_replicas != st.available_replicas;
    if p.paused {
        set_condition(
            conds,
            condition(
                "Progressing",
                "Unknown",
                "DeploymentPaused",
                "Deployment is paused".into(),
                now,
            ),
        );
        return None;
    }
    if complete {
        set_condition(
            conds,
            condition(
                "Progressing",
                "True",
                "NewReplicaSetAvailable",
                format!("ReplicaSet \"{new_name}\" has successfully progressed."),
                now,
            ),
        );
        return None;
    }
    let current = conds.iter().find(|c| c.type_ == "Progressing").cloned();
    let was_paused = current
        .as_ref()
        .is_some_and(|c| c.reason.as_deref() == Some("DeploymentPaused"));
    let exceeded = current
        .as_ref()
        .is_some_and(|c| c.reason.as_deref() == Some("ProgressDeadlineExceeded"));
    if progressed || was_paused || current.is_none() {
        let (reason, message) = reason.unwrap_or((
            "ReplicaSetUpdated",
            format!("ReplicaSet \"{new_name}\" is progressing."),
        ));
        // A fresh update time (the deadline counts from it) even when the message is the
        // same; the transition time only when the condition was not True before.
        let mut c = condition("Progressing", "True", reason, message, now);
        if let Some(o) = current.as_ref().filter(|o| o.status == "True") {
            c.last_transition_time = o.last_transition_time.clone();
        }
        conds.retain(|o| o.type_ != "Progressing");
        conds.push(c);
        return Some(Duration::from_secs(deadline.max(0) as u64));
    }
    if exceeded {
        // Reported once; it stays until the rollout moves again.
        return None;
    }
    let since = current
        .as_ref()
        .and_then(|c| c.last_update_time.as_ref())
        .map_or(secs(now), secs);
    let left = since + i64::from(deadline) - secs(now);
    if left > 0 {
        return Some(Duration::from_secs(left as u64));
    }
    set_condition(
        conds,
        condition(
            "Progressing",
            "False",
            "ProgressDeadlineExceeded",
            format!("ReplicaSet \"{new_name}\" has timed out progressing."),
            now,
        ),
    );
    None
}

#[cfg(test)]
mod tests {
    use super::super::plan;
    use super::super::testing::*;
    use super::*;
    use serde_json::json;

    #[test]
    fn set_condition_keeps_times_of_what_did_not_change() {
        let mut conds = vec![condition("Available", "True", "A", "m".into(), &at(0))];
        set_condition(
            &mut conds,
            condition("Available", "True", "A", "m".into(), &at(5)),
        );
        assert_eq!(conds.len(), 1);
        assert_eq!(conds[0].last_update_time, Some(at(0)));
        set_condition(
            &mut conds,
            condition("Available", "True", "B", "m".into(), &at(6)),
        );
        assert_eq!(
            (&conds[0].last_update_time, &conds[0].last_transition_time),
            (&Some(at(6)), &Some(at(0)))
        );
        set_condition(
            &mut conds,
            condition("Available", "False", "B", "m".into(), &at(7)),
        );
        assert_eq!(conds[0].last_transition_time, Some(at(7)));
    }

    #[test]
    fn progress_deadline_is_reported_and_requeued() {
        let mut d = deployment(1, "a", rolling(json!(1), json!(0)));
        d.spec.as_mut().unwrap().progress_deadline_seconds = Some(30);
        let mut m = Model::default();
        m.step(&mut d);
        // Its pods appear: progress at t=1, and a fresh deadline.
        let p = m.step(&mut d);
        assert_eq!(p.requeue, Some(Duration::from_secs(30)));
        let p = plan(&d, &m.rses, &at(11));
        assert_eq!(p.requeue, Some(Duration::from_secs(20)));
        let p = plan(&d, &m.rses, &at(40));
        d.status = p.status;
        let c = progressing(&d);
        assert_eq!(
            (c.status.as_str(), c.reason.as_deref()),
            ("False", Some("ProgressDeadlineExceeded"))
        );
    }
}
