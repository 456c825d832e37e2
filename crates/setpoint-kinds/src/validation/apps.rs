//! Workloads of `apps/v1` and ReplicationControllers: selectors that match their template,
//! immutable selectors, and the Deployment, ReplicaSet, StatefulSet and DaemonSet specs and
//! update strategies.

use serde_json::{json, Value};
use setpoint_api::selector::LabelSelector;
use setpoint_api::Cause;

use super::fields::{
    at, entries, int, is_empty_selector, label_selector, non_negative, not_supported,
    optional_enum, present, s, same, strip_nulls,
};
use super::meta::labels;
use super::pod::pod_template;

/// `spec.selector` of an apps/v1 workload: required, well-formed and not empty; returns the
/// parsed selector when it converts. `what` names the kind in upstream's message.
fn workload_selector(e: &mut Vec<Cause>, spec: &Value, what: &str) -> Option<LabelSelector> {
    let sel = at(spec, "selector");
    if sel.is_null() {
        e.push(Cause::required("spec.selector", ""));
        return None;
    }
    label_selector(e, sel, "spec.selector");
    if is_empty_selector(sel) {
        e.push(Cause::invalid(
            "spec.selector",
            sel,
            &format!("empty selector is invalid for {what}"),
        ));
    }
    match LabelSelector::from_label_selector_json(sel) {
        Ok(s) => Some(s),
        Err(_) => {
            e.push(Cause::invalid(
                "spec.selector",
                sel,
                "invalid label selector",
            ));
            None
        }
    }
}

/// The pod template of a controller: labels must match the selector, the pod must restart
/// `Always`, and it may not have a deadline.
fn controller_template(
    e: &mut Vec<Cause>,
    spec: &Value,
    selector: Option<&LabelSelector>,
    kind: &str,
) {
    let template = at(spec, "template");
    if template.is_null() {
        e.push(Cause::required("spec.template", ""));
        return;
    }
    if let Some(sel) = selector.filter(|s| !s.is_empty()) {
        if !sel.matches_object(template) {
            e.push(Cause::invalid(
                "spec.template.metadata.labels",
                at(at(template, "metadata"), "labels"),
                "`selector` does not match template `labels`",
            ));
        }
    }
    pod_template(e, template, "spec.template");
    let pod_spec = at(template, "spec");
    let rp = s(pod_spec, "restartPolicy");
    if !rp.is_empty() && rp != "Always" {
        not_supported(e, "spec.template.spec.restartPolicy", rp, &["Always"]);
    }
    let deadline = at(pod_spec, "activeDeadlineSeconds");
    if kind == "DaemonSet" && !deadline.is_null() {
        e.push(Cause::invalid(
            "spec.template.spec.activeDeadlineSeconds",
            deadline,
            "activeDeadlineSeconds must be nil for daemon sets",
        ));
    } else if !deadline.is_null() {
        e.push(Cause::forbidden(
            "spec.template.spec.activeDeadlineSeconds",
            &format!("activeDeadlineSeconds in {kind} is not Supported"),
        ));
    }
}

pub(super) fn immutable_selector(e: &mut Vec<Cause>, obj: &Value, old: Option<&Value>) {
    if let Some(old) = old {
        let (new_sel, old_sel) = (
            at(at(obj, "spec"), "selector"),
            at(at(old, "spec"), "selector"),
        );
        if !same(new_sel, old_sel) {
            e.push(Cause::immutable("spec.selector", new_sel));
        }
    }
}

pub(super) fn deployment(e: &mut Vec<Cause>, obj: &Value, old: Option<&Value>) {
    let spec = at(obj, "spec");
    non_negative(e, spec, "replicas", "spec.replicas");
    let selector = workload_selector(e, spec, "deployment");
    controller_template(e, spec, selector.as_ref(), "ReplicaSet");
    deployment_strategy(e, at(spec, "strategy"));
    non_negative(e, spec, "minReadySeconds", "spec.minReadySeconds");
    non_negative(e, spec, "revisionHistoryLimit", "spec.revisionHistoryLimit");
    if let Some(pd) = int(spec, "progressDeadlineSeconds") {
        non_negative(
            e,
            spec,
            "progressDeadlineSeconds",
            "spec.progressDeadlineSeconds",
        );
        if pd <= int(spec, "minReadySeconds").unwrap_or(0) {
            e.push(Cause::invalid(
                "spec.progressDeadlineSeconds",
                &json!(pd),
                "must be greater than minReadySeconds",
            ));
        }
    }
    immutable_selector(e, obj, old);
}

/// The number an int-or-percent stands for when compared with zero.
fn int_or_percent_value(v: &Value) -> Option<i64> {
    match v {
        Value::String(s) => s.strip_suffix('%').and_then(|n| n.parse().ok()),
        other => other.as_i64(),
    }
}

/// An int-or-percent field must be a non-negative int or a `<digits>%` string.
pub(super) fn positive_int_or_percent(e: &mut Vec<Cause>, v: &Value, path: &str) {
    match v {
        Value::String(s) => {
            let valid = s
                .strip_suffix('%')
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()));
            if !valid {
                e.push(Cause::invalid(
                    path,
                    v,
                    "must be an integer or percentage (e.g '5%')",
                ));
            }
        }
        other => {
            if other.as_i64().is_some_and(|n| n < 0) {
                e.push(Cause::invalid(
                    path,
                    v,
                    "must be greater than or equal to 0",
                ));
            }
        }
    }
}

fn deployment_strategy(e: &mut Vec<Cause>, strategy: &Value) {
    let ru = at(strategy, "rollingUpdate");
    match s(strategy, "type") {
        "Recreate" => {
            if !ru.is_null() {
                e.push(Cause::forbidden(
                    "spec.strategy.rollingUpdate",
                    "may not be specified when strategy `type` is 'Recreate'",
                ));
            }
        }
        "RollingUpdate" => {
            if ru.is_null() {
                e.push(Cause::required(
                    "spec.strategy.rollingUpdate",
                    "this should be defaulted and never be nil",
                ));
                return;
            }
            let (unavailable, surge) = (at(ru, "maxUnavailable"), at(ru, "maxSurge"));
            positive_int_or_percent(e, unavailable, "spec.strategy.rollingUpdate.maxUnavailable");
            positive_int_or_percent(e, surge, "spec.strategy.rollingUpdate.maxSurge");
            if int_or_percent_value(unavailable).unwrap_or(0) == 0
                && int_or_percent_value(surge).unwrap_or(0) == 0
            {
                e.push(Cause::invalid(
                    "spec.strategy.rollingUpdate.maxUnavailable",
                    unavailable,
                    "may not be 0 when `maxSurge` is 0",
                ));
            }
            if let Value::String(s) = unavailable {
                if int_or_percent_value(unavailable).is_some_and(|n| n > 100) {
                    e.push(Cause::invalid(
                        "spec.strategy.rollingUpdate.maxUnavailable",
                        &json!(s),
                        "must not be greater than 100%",
                    ));
                }
            }
        }
        other => not_supported(
            e,
            "spec.strategy.type",
            other,
            &["Recreate", "RollingUpdate"],
        ),
    }
}

pub(super) fn replica_set(e: &mut Vec<Cause>, obj: &Value, old: Option<&Value>) {
    let spec = at(obj, "spec");
    non_negative(e, spec, "replicas", "spec.replicas");
    non_negative(e, spec, "minReadySeconds", "spec.minReadySeconds");
    // Upstream's ReplicaSet message does say "deployment".
    let selector = workload_selector(e, spec, "deployment");
    controller_template(e, spec, selector.as_ref(), "ReplicaSet");
    immutable_selector(e, obj, old);
}

pub(super) fn replication_controller(e: &mut Vec<Cause>, obj: &Value) {
    let spec = at(obj, "spec");
    non_negative(e, spec, "minReadySeconds", "spec.minReadySeconds");
    non_negative(e, spec, "replicas", "spec.replicas");
    let sel = at(spec, "selector");
    if entries(sel).next().is_none() {
        e.push(Cause::required("spec.selector", ""));
    }
    labels(e, sel, "spec.selector");
    let pairs: Vec<(&String, &str)> = entries(sel)
        .filter_map(|(k, v)| v.as_str().map(|v| (k, v)))
        .collect();
    let reqs = pairs
        .iter()
        .filter_map(|(k, v)| {
            setpoint_api::selector::Requirement::new(
                k.as_str(),
                setpoint_api::selector::Operator::Equals,
                [*v],
            )
            .ok()
        })
        .collect();
    let selector = LabelSelector::from_requirements(reqs);
    controller_template(e, spec, Some(&selector), "ReplicationController");
}

pub(super) fn stateful_set(e: &mut Vec<Cause>, obj: &Value, old: Option<&Value>) {
    let spec = at(obj, "spec");
    optional_enum(
        e,
        spec,
        "podManagementPolicy",
        "spec.podManagementPolicy",
        &["OrderedReady", "Parallel"],
    );
    let us = at(spec, "updateStrategy");
    match s(us, "type") {
        "RollingUpdate" => {
            let ru = at(us, "rollingUpdate");
            non_negative(
                e,
                ru,
                "partition",
                "spec.updateStrategy.rollingUpdate.partition",
            );
        }
        "OnDelete" => {
            if present(us, "rollingUpdate") {
                e.push(Cause::invalid(
                    "spec.updateStrategy.rollingUpdate",
                    at(us, "rollingUpdate"),
                    "only allowed for updateStrategy 'RollingUpdate'",
                ));
            }
        }
        "" => e.push(Cause::required("spec.updateStrategy", "")),
        other => not_supported(
            e,
            "spec.updateStrategy",
            other,
            &["OnDelete", "RollingUpdate"],
        ),
    }
    let policy = at(spec, "persistentVolumeClaimRetentionPolicy");
    for field in ["whenDeleted", "whenScaled"] {
        optional_enum(
            e,
            policy,
            field,
            &format!("spec.persistentVolumeClaimRetentionPolicy.{field}"),
            &["Retain", "Delete"],
        );
    }
    non_negative(e, spec, "replicas", "spec.replicas");
    non_negative(e, spec, "minReadySeconds", "spec.minReadySeconds");
    non_negative(e, spec, "revisionHistoryLimit", "spec.revisionHistoryLimit");
    non_negative(e, at(spec, "ordinals"), "start", "spec.ordinals.start");
    let selector = workload_selector(e, spec, "statefulset");
    controller_template(e, spec, selector.as_ref(), "StatefulSet");
    if let Some(old) = old {
        // Only these may change; everything else in the spec is fixed at creation.
        let allowed = [
            "replicas",
            "ordinals",
            "template",
            "updateStrategy",
            "revisionHistoryLimit",
            "persistentVolumeClaimRetentionPolicy",
            "minReadySeconds",
        ];
        let rest = |v: &Value| -> Value {
            let mut m = strip_nulls(at(v, "spec"));
            if let Some(o) = m.as_object_mut() {
                for f in allowed {
                    o.remove(f);
                }
            }
            m
        };
        if rest(obj) != rest(old) {
            e.push(Cause::forbidden(
                "spec",
                "updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'revisionHistoryLimit', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden",
            ));
        }
    }
}

pub(super) fn daemon_set(e: &mut Vec<Cause>, obj: &Value, old: Option<&Value>) {
    let spec = at(obj, "spec");
    let selector = workload_selector(e, spec, "daemonset");
    controller_template(e, spec, selector.as_ref(), "DaemonSet");
    non_negative(e, spec, "minReadySeconds", "spec.minReadySeconds");
    non_negative(e, spec, "revisionHistoryLimit", "spec.revisionHistoryLimit");
    let us = at(spec, "updateStrategy");
    match s(us, "type") {
        "OnDelete" => {}
        "RollingUpdate" => {
            let ru = at(us, "rollingUpdate");
            if ru.is_null() {
                e.push(Cause::required("spec.updateStrategy.rollingUpdate", ""));
            } else {
                let (unavailable, surge) = (at(ru, "maxUnavailable"), at(ru, "maxSurge"));
                positive_int_or_percent(
                    e,
                    unavailable,
                    "spec.updateStrategy.rollingUpdate.maxUnavailable",
                );
                positive_int_or_percent(e, surge, "spec.updateStrategy.rollingUpdate.maxSurge");
                if int_or_percent_value(unavailable).unwrap_or(0) == 0
                    && int_or_percent_value(surge).unwrap_or(0) == 0
                {
                    e.push(Cause::invalid(
                        "spec.updateStrategy.rollingUpdate.maxUnavailable",
                        unavailable,
                        "may not be 0 when `maxSurge` is 0",
                    ));
                }
            }
        }
        "" => e.push(Cause::required("spec.updateStrategy.type", "")),
        other => not_supported(
            e,
            "spec.updateStrategy.type",
            other,
            &["OnDelete", "RollingUpdate"],
        ),
    }
    immutable_selector(e, obj, old);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::defaults;
    use crate::validation::testutil::{check, check_update, deployment, find};
    use crate::validation::unknown_fields;

    #[test]
    fn valid_deployment_has_no_causes_or_unknown_fields() {
        assert_eq!(check("apps", "v1", "Deployment", deployment()), vec![]);
        assert_eq!(
            unknown_fields("apps", "v1", "Deployment", &deployment()),
            Vec::<String>::new()
        );
        let mut d = deployment();
        defaults::apply("apps", "Deployment", &mut d);
        assert_eq!(
            unknown_fields("apps", "v1", "Deployment", &d),
            Vec::<String>::new()
        );
    }

    #[test]
    fn selector_must_match_template() {
        let mut d = deployment();
        d["spec"]["template"]["metadata"]["labels"] = json!({"app": "other"});
        let causes = check("apps", "v1", "Deployment", d);
        let c = find(&causes, "spec.template.metadata.labels");
        assert_eq!(c.reason, "FieldValueInvalid");
        assert!(
            c.message
                .ends_with("`selector` does not match template `labels`"),
            "{}",
            c.message
        );
    }

    #[test]
    fn selector_required_and_not_empty() {
        let mut d = deployment();
        d["spec"].as_object_mut().unwrap().remove("selector");
        let causes = check("apps", "v1", "Deployment", d);
        assert_eq!(find(&causes, "spec.selector").message, "Required value");
        let mut d = deployment();
        d["spec"]["selector"] = json!({});
        let causes = check("apps", "v1", "Deployment", d);
        assert!(find(&causes, "spec.selector")
            .message
            .ends_with("empty selector is invalid for deployment"));
    }

    #[test]
    fn negative_replicas() {
        let mut d = deployment();
        d["spec"]["replicas"] = json!(-1);
        let causes = check("apps", "v1", "Deployment", d);
        assert_eq!(
            find(&causes, "spec.replicas").message,
            "Invalid value: -1: must be greater than or equal to 0"
        );
    }

    #[test]
    fn deployment_updates() {
        let mut new = deployment();
        new["spec"]["selector"] = json!({"matchLabels": {"app": "web", "tier": "x"}});
        new["spec"]["template"]["metadata"]["labels"]["tier"] = json!("x");
        let causes = check_update("apps", "v1", "Deployment", deployment(), new);
        assert!(find(&causes, "spec.selector")
            .message
            .ends_with("field is immutable"));
        let mut scaled = deployment();
        scaled["spec"]["replicas"] = json!(5);
        scaled["metadata"]["uid"] = json!("");
        assert_eq!(
            check_update("apps", "v1", "Deployment", deployment(), scaled),
            vec![]
        );
        let mut renamed = deployment();
        renamed["metadata"]["name"] = json!("other");
        assert!(find(
            &check_update("apps", "v1", "Deployment", deployment(), renamed),
            "metadata.name"
        )
        .message
        .ends_with("field is immutable"));
    }

    #[test]
    fn deployment_strategies() {
        let mut d = deployment();
        d["spec"]["strategy"] = json!({"type": "Recreate", "rollingUpdate": {"maxSurge": 1}});
        let causes = check("apps", "v1", "Deployment", d);
        assert_eq!(
            find(&causes, "spec.strategy.rollingUpdate").message,
            "Forbidden: may not be specified when strategy `type` is 'Recreate'"
        );
        let mut d = deployment();
        d["spec"]["strategy"] = json!({"rollingUpdate": {"maxSurge": 0, "maxUnavailable": "0%"}});
        let causes = check("apps", "v1", "Deployment", d);
        assert!(find(&causes, "spec.strategy.rollingUpdate.maxUnavailable")
            .message
            .ends_with("may not be 0 when `maxSurge` is 0"));
        let mut d = deployment();
        d["spec"]["strategy"] = json!({"type": "BlueGreen"});
        let causes = check("apps", "v1", "Deployment", d);
        assert_eq!(
            find(&causes, "spec.strategy.type").message,
            "Unsupported value: \"BlueGreen\": supported values: \"Recreate\", \"RollingUpdate\""
        );
        let mut d = deployment();
        d["spec"]["strategy"] =
            json!({"rollingUpdate": {"maxSurge": "abc", "maxUnavailable": "120%"}});
        let causes = check("apps", "v1", "Deployment", d);
        assert!(find(&causes, "spec.strategy.rollingUpdate.maxSurge")
            .message
            .ends_with("must be an integer or percentage (e.g '5%')"));
        assert!(causes
            .iter()
            .any(|c| c.message.ends_with("must not be greater than 100%")));
    }

    #[test]
    fn stateful_sets() {
        let sts = json!({"metadata": {"name": "db"}, "spec": {
            "selector": {"matchLabels": {"app": "db"}}, "serviceName": "db",
            "template": {"metadata": {"labels": {"app": "db"}}, "spec": {"containers": [{"name": "db", "image": "redis:7"}]}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]
        }});
        assert_eq!(check("apps", "v1", "StatefulSet", sts.clone()), vec![]);
        let mut scaled = sts.clone();
        scaled["spec"]["replicas"] = json!(3);
        assert_eq!(
            check_update("apps", "v1", "StatefulSet", sts.clone(), scaled),
            vec![]
        );
        let mut bigger = sts.clone();
        bigger["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] =
            json!("2Gi");
        let causes = check_update("apps", "v1", "StatefulSet", sts.clone(), bigger);
        assert!(find(&causes, "spec").message.starts_with(
            "Forbidden: updates to statefulset spec for fields other than 'replicas'"
        ));
        let mut bad = sts;
        bad["spec"]["podManagementPolicy"] = json!("Random");
        bad["spec"]["selector"] = json!({});
        let causes = check("apps", "v1", "StatefulSet", bad);
        find(&causes, "spec.podManagementPolicy");
        assert!(find(&causes, "spec.selector")
            .message
            .ends_with("empty selector is invalid for statefulset"));
    }

    #[test]
    fn daemon_sets_replica_sets_and_rcs() {
        let tmpl = json!({"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{"name": "c", "image": "i:1"}]}});
        let ds = json!({"metadata": {"name": "d"}, "spec": {"selector": {"matchLabels": {"app": "x"}}, "template": tmpl}});
        assert_eq!(check("apps", "v1", "DaemonSet", ds.clone()), vec![]);
        let mut ds_bad = ds.clone();
        ds_bad["spec"]["updateStrategy"] =
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 0}});
        find(
            &check("apps", "v1", "DaemonSet", ds_bad),
            "spec.updateStrategy.rollingUpdate.maxUnavailable",
        );
        let rs = json!({"metadata": {"name": "r"}, "spec": {"selector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["x"]}]}, "template": tmpl}});
        assert_eq!(check("apps", "v1", "ReplicaSet", rs), vec![]);
        let rs_bad = json!({"metadata": {"name": "r"}, "spec": {"selector": {"matchExpressions": [{"key": "app", "operator": "In"}]}, "template": tmpl}});
        let causes = check("apps", "v1", "ReplicaSet", rs_bad);
        assert_eq!(
            find(&causes, "spec.selector.matchExpressions[0].values").message,
            "Required value: must be specified when `operator` is 'In' or 'NotIn'"
        );
        let rc = json!({"metadata": {"name": "r"}, "spec": {"template": tmpl}});
        assert_eq!(check("", "v1", "ReplicationController", rc), vec![]);
        let rc_bad = json!({"metadata": {"name": "r"}, "spec": {"selector": {"app": "y"}, "template": tmpl}});
        find(
            &check("", "v1", "ReplicationController", rc_bad),
            "spec.template.metadata.labels",
        );
    }
}
