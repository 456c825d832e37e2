//! Job tracking with pod finalizers, as upstream's Job controller does it: every pod a Job
//! creates carries [`FINALIZER`], so a finished pod cannot vanish (pod GC, a user's delete)
//! before the Job has counted it.
//!
//! A finished pod is counted in three steps, each persisted before the next:
//! 1. its UID is written to `status.uncountedTerminatedPods.{succeeded,failed}` (an Indexed
//!    Job's succeeded pod goes straight into `completedIndexes`, its index is enough);
//! 2. its finalizer is removed;
//! 3. UIDs whose pods no longer carry the finalizer (or are gone) move from
//!    `uncountedTerminatedPods` into the `succeeded`/`failed` counters.
//!
//! A restart between any two steps neither loses a pod (its UID is in the status before the
//! pod can go) nor counts it twice (a pod without the finalizer has been counted already, and
//! a UID is in the uncounted lists or in a counter, never both).

use std::collections::BTreeSet;

use k8s_openapi::api::batch::v1::{Job, UncountedTerminatedPods};
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use setpoint_runtime::client::Patch;

/// The finalizer on every pod a Job creates, until the Job has counted it.
pub const FINALIZER: &str = "batch.kubernetes.io/job-tracking";

/// Whether the pod still carries the tracking finalizer.
pub fn has_finalizer(pod: &Pod) -> bool {
    pod.metadata
        .finalizers
        .as_ref()
        .is_some_and(|fs| fs.iter().any(|f| f == FINALIZER))
}

/// Whether a pod counts as failed (upstream's `isPodFailed`): its phase is `Failed`, or —
/// unless the Job replaces only failed pods (`podReplacementPolicy: Failed`, or any
/// `podFailurePolicy`) — it is being deleted without having succeeded, since an orphaned or
/// deleted pod may never reach the `Failed` phase.
pub fn is_pod_failed(pod: &Pod, only_failed: bool) -> bool {
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending");
    if phase == "Failed" {
        return true;
    }
    !only_failed && pod.metadata.deletion_timestamp.is_some() && phase != "Succeeded"
}

/// The UIDs in a Job's `status.uncountedTerminatedPods`: (succeeded, failed).
pub fn uncounted(job: &Job) -> (BTreeSet<String>, BTreeSet<String>) {
    let u = job
        .status
        .as_ref()
        .and_then(|s| s.uncounted_terminated_pods.as_ref());
    let set = |v: Option<&Vec<String>>| v.into_iter().flatten().cloned().collect();
    (
        set(u.and_then(|u| u.succeeded.as_ref())),
        set(u.and_then(|u| u.failed.as_ref())),
    )
}

/// `status.uncountedTerminatedPods` holding these UIDs (written as `{}` when both are empty,
/// as upstream writes it).
pub fn to_status(
    succeeded: &BTreeSet<String>,
    failed: &BTreeSet<String>,
) -> UncountedTerminatedPods {
    let list = |s: &BTreeSet<String>| (!s.is_empty()).then(|| s.iter().cloned().collect());
    UncountedTerminatedPods {
        succeeded: list(succeeded),
        failed: list(failed),
    }
}

/// A JSON patch removing the tracking finalizer from `pod`, guarded by a test of the list as
/// read, so a concurrent change to the finalizers makes it fail rather than drop another's.
pub fn remove_finalizer(pod: &Pod) -> Patch {
    let all = pod.metadata.finalizers.clone().unwrap_or_default();
    let kept: Vec<&String> = all.iter().filter(|f| *f != FINALIZER).collect();
    Patch::Json(json!([
        {"op": "test", "path": "/metadata/finalizers", "value": all},
        {"op": "replace", "path": "/metadata/finalizers", "value": kept},
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn pod(phase: &str, deleting: bool) -> Pod {
        let mut p = Pod {
            status: Some(PodStatus {
                phase: Some(phase.into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        if deleting {
            p.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        }
        p
    }

    #[test]
    fn deleted_unfinished_pods_fail_unless_only_failed_pods_are_replaced() {
        assert!(is_pod_failed(&pod("Failed", false), true));
        assert!(is_pod_failed(&pod("Running", true), false));
        assert!(!is_pod_failed(&pod("Running", true), true));
        assert!(!is_pod_failed(&pod("Succeeded", true), false));
        assert!(!is_pod_failed(&pod("Running", false), false));
    }

    #[test]
    fn removal_keeps_other_finalizers_and_tests_the_list() {
        let mut p = pod("Succeeded", false);
        p.metadata.finalizers = Some(vec!["a/b".into(), FINALIZER.into()]);
        assert!(has_finalizer(&p));
        let Patch::Json(ops) = remove_finalizer(&p) else {
            panic!("a JSON patch")
        };
        assert_eq!(ops[0]["value"], json!(["a/b", FINALIZER]));
        assert_eq!(ops[1]["value"], json!(["a/b"]));
    }

    #[test]
    fn empty_uncounted_lists_are_written_as_an_empty_object() {
        let none = BTreeSet::new();
        let v = serde_json::to_value(to_status(&none, &none)).unwrap();
        assert_eq!(v, json!({}));
    }
}
