//! Taints against tolerations: the one rule the scheduler's `TaintToleration` filter, the
//! node lifecycle controller's NoExecute evictions and the DaemonSet controller's placement
//! share (upstream's `Toleration.ToleratesTaint` and `FindMatchingUntoleratedTaint`).

use k8s_openapi::api::core::v1::{Taint, Toleration};

/// The `NoSchedule` effect: new pods that do not tolerate the taint are not placed.
pub const NO_SCHEDULE: &str = "NoSchedule";
/// The `NoExecute` effect: pods that do not tolerate the taint are evicted too.
pub const NO_EXECUTE: &str = "NoExecute";
/// The `PreferNoSchedule` effect: a preference only, never a refusal.
pub const PREFER_NO_SCHEDULE: &str = "PreferNoSchedule";

/// Whether a toleration tolerates a taint (upstream's `ToleratesTaint`): effects match when
/// the toleration names none; keys match when it names none (only valid with `Exists`, which
/// then tolerates everything); `Equal` (the default) compares values, a missing value being
/// the empty one; any other operator tolerates nothing.
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or("");
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or("");
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("") {
        "" | "Equal" => {
            toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
        "Exists" => true,
        _ => false,
    }
}

/// Whether any of `tolerations` tolerates `taint`.
pub fn tolerated(taint: &Taint, tolerations: &[Toleration]) -> bool {
    tolerations.iter().any(|t| tolerates(t, taint))
}

/// The first `NoSchedule` or `NoExecute` taint no toleration tolerates (what keeps a pod off
/// a node; `PreferNoSchedule` never does).
pub fn untolerated_taint<'t>(taints: &'t [Taint], tolerations: &[Toleration]) -> Option<&'t Taint> {
    taints
        .iter()
        .filter(|t| t.effect == NO_SCHEDULE || t.effect == NO_EXECUTE)
        .find(|t| !tolerated(t, tolerations))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: value.map(String::from),
            effect: effect.into(),
            time_added: None,
        }
    }

    fn tol(
        key: Option<&str>,
        op: Option<&str>,
        value: Option<&str>,
        effect: Option<&str>,
    ) -> Toleration {
        Toleration {
            key: key.map(String::from),
            operator: op.map(String::from),
            value: value.map(String::from),
            effect: effect.map(String::from),
            toleration_seconds: None,
        }
    }

    #[test]
    fn matching_follows_upstream() {
        let t = taint("dedicated", Some("gpu"), NO_SCHEDULE);
        assert!(tolerates(
            &tol(
                Some("dedicated"),
                Some("Equal"),
                Some("gpu"),
                Some(NO_SCHEDULE)
            ),
            &t
        ));
        assert!(
            tolerates(&tol(Some("dedicated"), None, Some("gpu"), None), &t),
            "Equal is the default"
        );
        assert!(!tolerates(
            &tol(Some("dedicated"), None, Some("cpu"), None),
            &t
        ));
        assert!(!tolerates(
            &tol(Some("dedicated"), Some("Equal"), None, None),
            &t
        ));
        assert!(tolerates(
            &tol(Some("dedicated"), Some("Exists"), None, None),
            &t
        ));
        assert!(!tolerates(
            &tol(Some("other"), Some("Exists"), None, None),
            &t
        ));
        assert!(!tolerates(
            &tol(Some("dedicated"), Some("Exists"), None, Some(NO_EXECUTE)),
            &t
        ));
        assert!(
            tolerates(&tol(None, Some("Exists"), None, None), &t),
            "empty key with Exists"
        );
        assert!(!tolerates(
            &tol(Some("dedicated"), Some("Lt"), Some("gpu"), None),
            &t
        ));
        let bare = taint("flag", None, NO_EXECUTE);
        assert!(
            tolerates(&tol(Some("flag"), Some("Equal"), None, None), &bare),
            "missing value is empty"
        );
    }

    #[test]
    fn prefer_no_schedule_never_refuses() {
        let taints = vec![
            taint("soft", None, PREFER_NO_SCHEDULE),
            taint("hard", None, NO_SCHEDULE),
        ];
        assert_eq!(
            untolerated_taint(&taints, &[]).map(|t| t.key.as_str()),
            Some("hard")
        );
        let ok = [tol(Some("hard"), Some("Exists"), None, None)];
        assert_eq!(untolerated_taint(&taints, &ok), None);
    }
}
