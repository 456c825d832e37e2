//! Which webhooks a request calls: upstream's rule matcher (operations, API groups and
//! versions, resources with their subresources, scope), `matchPolicy` (an `Equivalent`
//! webhook also matches the same objects served under another group or version), and the
//! namespace and object label selectors. Pure: the caller supplies the request's facts.

use serde_json::{Map, Value};
use setpoint_api::selector::LabelSelector;

/// The resource a request names, or one equivalent to it (the same stored objects).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Resource {
    pub group: String,
    pub version: String,
    pub resource: String,
    pub kind: String,
    pub namespaced: bool,
}

/// What a rule is matched against.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Operation<'a> {
    /// `CREATE`, `UPDATE`, `DELETE` or `CONNECT`.
    pub operation: &'a str,
    /// `""` for the main resource, else `status`, `scale`, …
    pub subresource: &'a str,
}

fn strings<'a>(v: &'a Value, key: &str) -> impl Iterator<Item = &'a str> {
    v.get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

fn listed(v: &Value, key: &str, want: &str) -> bool {
    strings(v, key).any(|s| s == "*" || s == want)
}

/// Upstream's `Matcher.Matches` for one `RuleWithOperations`.
pub(crate) fn rule_matches(rule: &Value, op: Operation<'_>, res: &Resource) -> bool {
    let scope = match rule.get("scope").and_then(Value::as_str).unwrap_or("*") {
        "Cluster" => !res.namespaced,
        "Namespaced" => res.namespaced,
        _ => true,
    };
    let resource = strings(rule, "resources").any(|r| {
        let (name, sub) = r.split_once('/').unwrap_or((r, ""));
        (name == "*" || name == res.resource) && (sub == "*" || sub == op.subresource)
    });
    scope
        && resource
        && listed(rule, "operations", op.operation)
        && listed(rule, "apiGroups", &res.group)
        && listed(rule, "apiVersions", &res.version)
}

/// The first of `candidates` (the request's resource first, then its equivalents) one of
/// the webhook's rules matches; `Exact` webhooks look only at the request's own resource.
pub(crate) fn matched_resource(
    hook: &Value,
    op: Operation<'_>,
    candidates: &[Resource],
) -> Option<usize> {
    let rules: &[Value] = hook
        .get("rules")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let exact = hook.get("matchPolicy").and_then(Value::as_str) == Some("Exact");
    let considered = if exact { 1 } else { candidates.len() };
    candidates
        .iter()
        .take(considered)
        .position(|res| rules.iter().any(|r| rule_matches(r, op, res)))
}

/// A label selector against labels; a selector that does not parse matches nothing (the
/// configuration's validation rejects such selectors, so this is only defensive).
fn selects(sel: Option<&Value>, labels: Option<&Map<String, Value>>) -> bool {
    let Some(sel) = sel.filter(|s| !s.is_null()) else {
        return true;
    };
    let Ok(sel) = LabelSelector::from_label_selector_json(sel) else {
        return false;
    };
    let empty = Map::new();
    sel.matches_map(labels.unwrap_or(&empty))
}

fn labels(obj: &Value) -> Option<&Map<String, Value>> {
    obj.pointer("/metadata/labels").and_then(Value::as_object)
}

/// `namespaceSelector`: cluster-scoped requests other than for namespaces always match;
/// a namespace is matched by its own labels; anything else by its namespace's.
pub(crate) fn namespace_matches(
    hook: &Value,
    res: &Resource,
    namespace: &str,
    object: Option<&Value>,
    old: Option<&Value>,
    namespace_object: Option<&Value>,
) -> bool {
    let sel = hook.get("namespaceSelector");
    if res.group.is_empty() && res.resource == "namespaces" {
        let obj = object.or(old);
        return selects(sel, obj.and_then(labels));
    }
    if namespace.is_empty() {
        return true;
    }
    selects(sel, namespace_object.and_then(labels))
}

/// `objectSelector`: matches when the new or the old object's labels do (an empty selector
/// matches everything, even requests without an object).
pub(crate) fn object_matches(hook: &Value, object: Option<&Value>, old: Option<&Value>) -> bool {
    let sel = hook.get("objectSelector");
    let everything = sel.is_none_or(|s| {
        s.is_null()
            || (s
                .get("matchLabels")
                .and_then(Value::as_object)
                .is_none_or(Map::is_empty)
                && s.get("matchExpressions")
                    .and_then(Value::as_array)
                    .is_none_or(Vec::is_empty))
    });
    if everything {
        return true;
    }
    [object, old]
        .into_iter()
        .flatten()
        .any(|o| selects(sel, labels(o)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn res(group: &str, version: &str, resource: &str, namespaced: bool) -> Resource {
        Resource {
            group: group.into(),
            version: version.into(),
            resource: resource.into(),
            kind: String::new(),
            namespaced,
        }
    }

    const CREATE: Operation = Operation {
        operation: "CREATE",
        subresource: "",
    };

    #[test]
    fn rules_match_operations_groups_versions_and_resources() {
        let rule = json!({"operations": ["CREATE", "UPDATE"], "apiGroups": [""],
                          "apiVersions": ["v1"], "resources": ["configmaps"]});
        let cm = res("", "v1", "configmaps", true);
        assert!(rule_matches(&rule, CREATE, &cm));
        let delete = Operation {
            operation: "DELETE",
            subresource: "",
        };
        assert!(!rule_matches(&rule, delete, &cm));
        assert!(!rule_matches(
            &rule,
            CREATE,
            &res("", "v1", "secrets", true)
        ));
        assert!(!rule_matches(
            &rule,
            CREATE,
            &res("apps", "v1", "configmaps", true)
        ));
        let any = json!({"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"],
                         "resources": ["*"]});
        assert!(rule_matches(
            &any,
            delete,
            &res("apps", "v1", "deployments", true)
        ));
    }

    #[test]
    fn subresources_match_only_when_named() {
        let status = Operation {
            operation: "UPDATE",
            subresource: "status",
        };
        let pods = res("", "v1", "pods", true);
        let rule = |r: &[&str]| {
            json!({"operations": ["*"], "apiGroups": ["*"],
                                       "apiVersions": ["*"], "resources": r})
        };
        assert!(!rule_matches(&rule(&["pods"]), status, &pods));
        assert!(!rule_matches(&rule(&["*"]), status, &pods));
        assert!(rule_matches(&rule(&["pods/status"]), status, &pods));
        assert!(rule_matches(&rule(&["pods/*"]), status, &pods));
        assert!(rule_matches(&rule(&["*/status"]), status, &pods));
        assert!(rule_matches(&rule(&["*/*"]), status, &pods));
        assert!(!rule_matches(&rule(&["pods/status"]), CREATE, &pods));
    }

    #[test]
    fn scope_separates_namespaced_from_cluster_resources() {
        let rule = |scope: &str| {
            json!({"operations": ["*"], "apiGroups": ["*"],
                                        "apiVersions": ["*"], "resources": ["*"], "scope": scope})
        };
        let cm = res("", "v1", "configmaps", true);
        let node = res("", "v1", "nodes", false);
        assert!(rule_matches(&rule("Namespaced"), CREATE, &cm));
        assert!(!rule_matches(&rule("Namespaced"), CREATE, &node));
        assert!(rule_matches(&rule("Cluster"), CREATE, &node));
        assert!(!rule_matches(&rule("Cluster"), CREATE, &cm));
        assert!(rule_matches(&rule("*"), CREATE, &node));
    }

    #[test]
    fn equivalent_webhooks_match_other_versions_of_the_same_objects() {
        let hook = |policy: &str| {
            json!({"matchPolicy": policy, "rules": [{
            "operations": ["CREATE"], "apiGroups": ["autoscaling"], "apiVersions": ["v2"],
            "resources": ["horizontalpodautoscalers"]}]})
        };
        let candidates = [
            res("autoscaling", "v1", "horizontalpodautoscalers", true),
            res("autoscaling", "v2", "horizontalpodautoscalers", true),
        ];
        assert_eq!(
            matched_resource(&hook("Equivalent"), CREATE, &candidates),
            Some(1)
        );
        assert_eq!(matched_resource(&hook("Exact"), CREATE, &candidates), None);
        assert_eq!(
            matched_resource(&hook("Exact"), CREATE, &candidates[1..]),
            Some(0)
        );
    }

    #[test]
    fn object_selector_matches_new_or_old_labels() {
        let hook = json!({"objectSelector": {"matchLabels": {"checked": "yes"}}});
        let with = json!({"metadata": {"labels": {"checked": "yes"}}});
        let without = json!({"metadata": {}});
        assert!(object_matches(&hook, Some(&with), None));
        assert!(!object_matches(&hook, Some(&without), None));
        assert!(object_matches(&hook, Some(&without), Some(&with)));
        assert!(!object_matches(&hook, None, None));
        assert!(object_matches(&json!({"objectSelector": {}}), None, None));
    }

    #[test]
    fn namespace_selector_reads_the_namespace_or_the_namespace_itself() {
        let hook = json!({"namespaceSelector": {"matchExpressions": [
            {"key": "env", "operator": "In", "values": ["prod"]}]}});
        let prod = json!({"metadata": {"name": "p", "labels": {"env": "prod"}}});
        let dev = json!({"metadata": {"name": "d", "labels": {"env": "dev"}}});
        let cm = res("", "v1", "configmaps", true);
        assert!(namespace_matches(&hook, &cm, "p", None, None, Some(&prod)));
        assert!(!namespace_matches(&hook, &cm, "d", None, None, Some(&dev)));
        assert!(!namespace_matches(&hook, &cm, "gone", None, None, None));
        let node = res("", "v1", "nodes", false);
        assert!(namespace_matches(&hook, &node, "", None, None, None));
        let ns = res("", "v1", "namespaces", false);
        assert!(namespace_matches(&hook, &ns, "", Some(&prod), None, None));
        assert!(!namespace_matches(&hook, &ns, "", Some(&dev), None, None));
    }
}
