//! `rbac.authorization.k8s.io/v1`: Roles, ClusterRoles and their bindings, with the rules and
//! messages of upstream's `pkg/apis/rbac/validation`.

use serde_json::{json, Value};
use setpoint_api::{names, Cause};

use super::fields::{arr, at, dns_subdomain, index, label_selector, not_supported, s};

/// The RBAC API group, which `roleRef.apiGroup` and User/Group subjects name.
const GROUP: &str = "rbac.authorization.k8s.io";

/// A Role: every rule is namespaced (no `nonResourceURLs`).
pub(super) fn role(e: &mut Vec<Cause>, obj: &Value) {
    rules(e, obj, true);
}

/// A ClusterRole: its rules, and its `aggregationRule` when set.
pub(super) fn cluster_role(e: &mut Vec<Cause>, obj: &Value) {
    rules(e, obj, false);
    let agg = at(obj, "aggregationRule");
    if agg.is_object() {
        let selectors = arr(agg, "clusterRoleSelectors");
        if selectors.is_empty() {
            e.push(Cause::required(
                "aggregationRule.clusterRoleSelectors",
                "at least one clusterRoleSelector required if aggregationRule is non-nil",
            ));
        }
        for (i, sel) in selectors.iter().enumerate() {
            label_selector(e, sel, &index("aggregationRule.clusterRoleSelectors", i));
        }
    }
}

/// `ValidatePolicyRule` for each rule.
fn rules(e: &mut Vec<Cause>, obj: &Value, namespaced: bool) {
    for (i, rule) in arr(obj, "rules").iter().enumerate() {
        let path = index("rules", i);
        if arr(rule, "verbs").is_empty() {
            e.push(Cause::required(
                format!("{path}.verbs"),
                "verbs must contain at least one value",
            ));
        }
        let urls = arr(rule, "nonResourceURLs");
        if !urls.is_empty() {
            let value = Value::Array(urls.to_vec());
            if namespaced {
                e.push(Cause::invalid(
                    format!("{path}.nonResourceURLs"),
                    &value,
                    "namespaced rules cannot apply to non-resource URLs",
                ));
            }
            if !arr(rule, "apiGroups").is_empty()
                || !arr(rule, "resources").is_empty()
                || !arr(rule, "resourceNames").is_empty()
            {
                e.push(Cause::invalid(
                    format!("{path}.nonResourceURLs"),
                    &value,
                    "rules cannot apply to both regular resources and non-resource URLs",
                ));
            }
            continue;
        }
        if arr(rule, "apiGroups").is_empty() {
            e.push(Cause::required(
                format!("{path}.apiGroups"),
                "resource rules must supply at least one api group",
            ));
        }
        if arr(rule, "resources").is_empty() {
            e.push(Cause::required(
                format!("{path}.resources"),
                "resource rules must supply at least one resource",
            ));
        }
    }
}

/// A RoleBinding: it may reference a Role or a ClusterRole; `roleRef` cannot change.
pub(super) fn role_binding(e: &mut Vec<Cause>, obj: &Value, old: Option<&Value>) {
    binding(e, obj, old, &["Role", "ClusterRole"], true);
}

/// A ClusterRoleBinding: it references a ClusterRole; ServiceAccount subjects name their
/// namespace.
pub(super) fn cluster_role_binding(e: &mut Vec<Cause>, obj: &Value, old: Option<&Value>) {
    binding(e, obj, old, &["ClusterRole"], false);
}

fn binding(e: &mut Vec<Cause>, obj: &Value, old: Option<&Value>, kinds: &[&str], ns: bool) {
    let role_ref = at(obj, "roleRef");
    let group = s(role_ref, "apiGroup");
    if group != GROUP {
        not_supported(e, "roleRef.apiGroup", group, &[GROUP]);
    }
    let kind = s(role_ref, "kind");
    if !kinds.contains(&kind) {
        not_supported(e, "roleRef.kind", kind, kinds);
    }
    let name = s(role_ref, "name");
    if name.is_empty() {
        e.push(Cause::required("roleRef.name", ""));
    } else {
        for msg in names::path_segment_name(name).err().unwrap_or_default() {
            e.push(Cause::invalid("roleRef.name", &json!(name), &msg));
        }
    }
    for (i, subject) in arr(obj, "subjects").iter().enumerate() {
        self::subject(e, subject, ns, &index("subjects", i));
    }
    if let Some(old) = old {
        let before = at(old, "roleRef");
        if !before.is_null() && before != role_ref {
            e.push(Cause::invalid("roleRef", role_ref, "cannot change roleRef"));
        }
    }
}

/// `ValidateRoleBindingSubject`.
fn subject(e: &mut Vec<Cause>, subject: &Value, namespaced: bool, path: &str) {
    let name = s(subject, "name");
    if name.is_empty() {
        e.push(Cause::required(format!("{path}.name"), ""));
    }
    let group = s(subject, "apiGroup");
    match s(subject, "kind") {
        "ServiceAccount" => {
            if !name.is_empty() {
                dns_subdomain(e, name, &format!("{path}.name"));
            }
            if !group.is_empty() {
                not_supported(e, format!("{path}.apiGroup"), group, &[""]);
            }
            if !namespaced && s(subject, "namespace").is_empty() {
                e.push(Cause::required(format!("{path}.namespace"), ""));
            }
        }
        "User" | "Group" => {
            if group != GROUP {
                not_supported(e, format!("{path}.apiGroup"), group, &[GROUP]);
            }
        }
        other => not_supported(
            e,
            format!("{path}.kind"),
            other,
            &["ServiceAccount", "User", "Group"],
        ),
    }
}

#[cfg(test)]
mod tests {
    use crate::validation::testutil::{check, find};
    use serde_json::json;

    const V: &str = "rbac.authorization.k8s.io";

    #[test]
    fn rules_need_verbs_and_resources_and_urls_only_in_cluster_roles() {
        let role = json!({"metadata": {"name": "r", "namespace": "a"}, "rules": [
            {"apiGroups": [""], "resources": ["pods"]},
            {"verbs": ["get"], "nonResourceURLs": ["/healthz"]},
            {"verbs": ["get"]},
        ]});
        let causes = check(V, "v1", "Role", role);
        assert_eq!(
            find(&causes, "rules[0].verbs").message,
            "Required value: verbs must contain at least one value"
        );
        assert!(find(&causes, "rules[1].nonResourceURLs")
            .message
            .ends_with("namespaced rules cannot apply to non-resource URLs"));
        assert!(find(&causes, "rules[2].apiGroups")
            .message
            .ends_with("resource rules must supply at least one api group"));
        assert!(find(&causes, "rules[2].resources")
            .message
            .ends_with("resource rules must supply at least one resource"));
        let cr = json!({"metadata": {"name": "system:x"}, "rules": [
            {"verbs": ["get"], "nonResourceURLs": ["/healthz", "/api/*"]},
        ]});
        assert!(check(V, "v1", "ClusterRole", cr).is_empty());
        let agg = json!({"metadata": {"name": "x"}, "aggregationRule": {}});
        assert!(find(
            &check(V, "v1", "ClusterRole", agg),
            "aggregationRule.clusterRoleSelectors"
        )
        .message
        .ends_with("at least one clusterRoleSelector required if aggregationRule is non-nil"));
    }

    #[test]
    fn bindings_check_role_ref_and_subjects() {
        let rb = json!({"metadata": {"name": "b", "namespace": "a"},
        "roleRef": {"apiGroup": V, "kind": "Secret", "name": ""},
        "subjects": [
            {"kind": "Robot", "name": "r"},
            {"kind": "User", "apiGroup": V, "name": "alice"},
            {"kind": "ServiceAccount", "name": "bot"},
        ]});
        let causes = check(V, "v1", "RoleBinding", rb);
        assert!(find(&causes, "roleRef.kind")
            .message
            .contains(r#"Unsupported value: "Secret": supported values: "Role", "ClusterRole""#));
        assert_eq!(find(&causes, "roleRef.name").message, "Required value");
        assert!(find(&causes, "subjects[0].kind")
            .message
            .contains(r#"supported values: "ServiceAccount", "User", "Group""#));
        assert_eq!(causes.len(), 3, "{causes:?}");
        let crb = json!({"metadata": {"name": "b"},
            "roleRef": {"apiGroup": V, "kind": "Role", "name": "x"},
            "subjects": [{"kind": "ServiceAccount", "name": "bot"}]});
        let causes = check(V, "v1", "ClusterRoleBinding", crb);
        find(&causes, "roleRef.kind");
        find(&causes, "subjects[0].namespace");
    }

    #[test]
    fn role_ref_is_immutable() {
        let old = json!({"metadata": {"name": "b", "namespace": "a", "resourceVersion": "1"},
            "roleRef": {"apiGroup": V, "kind": "Role", "name": "x"}});
        let mut new = old.clone();
        new["roleRef"]["name"] = json!("y");
        let causes = crate::validation::validate(V, "v1", "RoleBinding", &new, Some(&old));
        assert!(find(&causes, "roleRef")
            .message
            .ends_with("cannot change roleRef"));
    }
}
