//! RBAC's escalation prevention, as upstream's RBAC storage enforces it: whoever writes a Role
//! or ClusterRole must already hold every rule it grants (in that namespace, or cluster-wide
//! for a ClusterRole) unless they may `escalate` roles; whoever writes a binding must hold
//! every rule of the role it references unless they may `bind` that role. Members of
//! `system:masters` and the server's own writes are never limited.
//!
//! "Holds" is upstream's `Covers`: each rule to grant is broken down into rules of one verb,
//! one group, one resource (and one name), and each of those must be covered by a rule the
//! writer has. What is missing is reported compacted, one rule a line, word for word as
//! `ConfirmNoEscalation` words it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::Value;
use setpoint_api::ApiError;

use super::rbac::{PolicyRule, GROUP};
use super::{Attributes, Decision};
use crate::authentication::{UserInfo, MASTERS};
use crate::registry::ResourceDef;
use crate::state::ApiServer;

/// One rule per verb, group, resource and name (or per verb and path): upstream's
/// `BreakdownRule`.
pub fn breakdown(rule: &PolicyRule) -> Vec<PolicyRule> {
    let mut out = Vec::new();
    let one = |s: &String| vec![s.clone()];
    for group in &rule.api_groups {
        for resource in &rule.resources {
            for verb in &rule.verbs {
                let base = PolicyRule {
                    verbs: one(verb),
                    api_groups: one(group),
                    resources: one(resource),
                    ..PolicyRule::default()
                };
                if rule.resource_names.is_empty() {
                    out.push(base);
                } else {
                    for name in &rule.resource_names {
                        out.push(PolicyRule {
                            resource_names: one(name),
                            ..base.clone()
                        });
                    }
                }
            }
        }
    }
    for url in &rule.non_resource_urls {
        for verb in &rule.verbs {
            out.push(PolicyRule {
                verbs: one(verb),
                non_resource_urls: one(url),
                ..PolicyRule::default()
            });
        }
    }
    out
}

fn has(set: &[String], item: &str) -> bool {
    set.iter().any(|s| s == item)
}

fn has_all(set: &[String], items: &[String]) -> bool {
    items.iter().all(|i| has(set, i))
}

/// Whether `owner` covers every rule `sub` grants (upstream's `ruleCovers`).
fn rule_covers(owner: &PolicyRule, sub: &PolicyRule) -> bool {
    let verbs = has(&owner.verbs, "*") || has_all(&owner.verbs, &sub.verbs);
    let groups = has(&owner.api_groups, "*") || has_all(&owner.api_groups, &sub.api_groups);
    let resources = has(&owner.resources, "*")
        || sub.resources.iter().all(|r| {
            has(&owner.resources, r)
                || r.split_once('/')
                    .is_some_and(|(_, sub)| has(&owner.resources, &format!("*/{sub}")))
        });
    let urls = sub.non_resource_urls.iter().all(|path| {
        owner.non_resource_urls.iter().any(|o| {
            o == path
                || o.strip_suffix('*')
                    .is_some_and(|prefix| path.starts_with(prefix))
        })
    });
    let names = owner.resource_names.is_empty()
        || (!sub.resource_names.is_empty() && has_all(&owner.resource_names, &sub.resource_names));
    verbs && groups && resources && urls && names
}

/// Whether `owner` covers all of `rules`, and the broken-down rules it does not cover
/// (upstream's `Covers`).
pub fn covers(owner: &[PolicyRule], rules: &[PolicyRule]) -> (bool, Vec<PolicyRule>) {
    let missing: Vec<PolicyRule> = rules
        .iter()
        .flat_map(breakdown)
        .filter(|r| !owner.iter().any(|o| rule_covers(o, r)))
        .collect();
    (missing.is_empty(), missing)
}

/// Merges broken-down rules that differ only in their verb (upstream's `CompactRules`).
fn compact(rules: Vec<PolicyRule>) -> Vec<PolicyRule> {
    let mut out = Vec::new();
    let mut simple: BTreeMap<(String, String, Vec<String>), PolicyRule> = BTreeMap::new();
    for rule in rules {
        let is_simple = rule.non_resource_urls.is_empty()
            && rule.api_groups.len() == 1
            && rule.resources.len() == 1
            && rule.resource_names.len() <= 1;
        if !is_simple {
            out.push(rule);
            continue;
        }
        let key = (
            rule.api_groups[0].clone(),
            rule.resources[0].clone(),
            rule.resource_names.clone(),
        );
        match simple.get_mut(&key) {
            Some(existing) => existing.verbs.extend(rule.verbs),
            None => {
                simple.insert(key, rule);
            }
        }
    }
    out.extend(simple.into_values());
    out
}

/// Go's `%q` of a string slice: `["a" "b"]`.
fn quoted(items: &[String]) -> String {
    let parts: Vec<String> = items.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", parts.join(" "))
}

/// A rule as upstream's `CompactString` prints it:
/// `{APIGroups:[""], Resources:["pods"], Verbs:["get" "list"]}`.
pub fn compact_string(r: &PolicyRule) -> String {
    let mut parts = Vec::new();
    for (label, items) in [
        ("APIGroups", &r.api_groups),
        ("Resources", &r.resources),
        ("NonResourceURLs", &r.non_resource_urls),
        ("ResourceNames", &r.resource_names),
        ("Verbs", &r.verbs),
    ] {
        if !items.is_empty() {
            parts.push(format!("{label}:{}", quoted(items)));
        }
    }
    format!("{{{}}}", parts.join(", "))
}

/// `ConfirmNoEscalation`: `Err(message)` when `owner` does not cover `rules`.
pub fn confirm_no_escalation(
    user: &UserInfo,
    owner: &[PolicyRule],
    rules: &[PolicyRule],
) -> Result<(), String> {
    let (ok, missing) = covers(owner, rules);
    if ok {
        return Ok(());
    }
    // A sorted set, as upstream's `sets.String` lists it.
    let lines: BTreeSet<String> = compact(missing).iter().map(compact_string).collect();
    Err(format!(
        "user {:?} (groups={}) is attempting to grant RBAC permissions not currently held:\n{}",
        user.username,
        quoted(&user.groups),
        lines.into_iter().collect::<Vec<_>>().join("\n")
    ))
}

/// The attributes of a special RBAC verb (`escalate`, `bind`) on a role.
fn special(user: &Arc<UserInfo>, verb: &str, resource: &str, ns: &str, name: &str) -> Attributes {
    let mut a = Attributes::non_resource(user.clone(), &http::Method::POST, "");
    a.verb = verb.to_string();
    a.resource_request = true;
    a.api_group = GROUP.to_string();
    a.api_version = "*".to_string();
    a.resource = resource.to_string();
    a.namespace = ns.to_string();
    a.name = name.to_string();
    a
}

impl ApiServer {
    /// [`check`] for a write with these options (the writer is `opts.user`).
    pub(crate) fn check_escalation(
        &self,
        res: &ResourceDef,
        namespace: &str,
        obj: &Value,
        opts: &crate::objects::WriteOptions,
    ) -> Result<(), ApiError> {
        check(self, res, namespace, obj, opts.user.as_ref())
    }
}

/// Refuses a create or update of a Role, ClusterRole, RoleBinding or ClusterRoleBinding that
/// would grant `user` (the writer) more than they hold. `None` is the server itself. Other
/// kinds pass untouched.
pub(crate) fn check(
    server: &ApiServer,
    res: &ResourceDef,
    namespace: &str,
    obj: &Value,
    user: Option<&Arc<UserInfo>>,
) -> Result<(), ApiError> {
    if res.group != GROUP || res.custom.is_some() {
        return Ok(());
    }
    let Some(user) = user else {
        return Ok(());
    };
    // Upstream's `EscalationAllowed`: the privileged group may grant anything.
    if user.in_group(MASTERS) {
        return Ok(());
    }
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let gr = res.group_resource();
    let allowed = |a: &Attributes| server.authorizers.decide(a) == Decision::Allow;
    match res.kind.as_str() {
        "Role" | "ClusterRole" => {
            if allowed(&special(user, "escalate", &res.plural, namespace, name)) {
                return Ok(());
            }
            if res.kind == "ClusterRole" && obj.get("aggregationRule").is_some_and(|a| !a.is_null())
            {
                return Err(ApiError::forbidden(
                    &gr,
                    name,
                    "must have cluster-admin privileges to use the aggregationRule",
                ));
            }
            let rules = PolicyRule::of(obj);
            let owner = server.rbac.rules_for(user, namespace);
            confirm_no_escalation(user, &owner, &rules)
                .map_err(|msg| ApiError::forbidden(&gr, name, &msg))
        }
        "RoleBinding" | "ClusterRoleBinding" => {
            let kind = obj
                .pointer("/roleRef/kind")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let role = obj
                .pointer("/roleRef/name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let (plural, role_ns) = match kind {
                "Role" => ("roles", namespace),
                _ => ("clusterroles", ""),
            };
            // Upstream's `BindingAuthorized`: `bind` on the role, in the binding's namespace.
            if allowed(&special(user, "bind", plural, namespace, role)) {
                return Ok(());
            }
            let policy = server.rbac.policy();
            let rules = match kind {
                "Role" => policy.role(role_ns, role),
                _ => policy.cluster_role(role),
            };
            let Some(rules) = rules else {
                let gr = setpoint_api::GroupResource {
                    group: GROUP.to_string(),
                    resource: plural.to_string(),
                };
                return Err(ApiError::not_found(&gr, role));
            };
            let owner = super::rbac::rules_for(&policy, user, namespace);
            confirm_no_escalation(user, &owner, rules)
                .map_err(|msg| ApiError::forbidden(&gr, name, &msg))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rule(v: Value) -> PolicyRule {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn covers_as_upstream() {
        let owner = [
            rule(json!({"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods"]})),
            rule(json!({"verbs": ["*"], "apiGroups": ["apps"], "resources": ["*/scale"]})),
            rule(
                json!({"verbs": ["get"], "apiGroups": [""], "resources": ["secrets"], "resourceNames": ["s1"]}),
            ),
            rule(json!({"verbs": ["get"], "nonResourceURLs": ["/apis/*"]})),
        ];
        let ok = |v: Value| covers(&owner, &[rule(v)]).0;
        assert!(ok(
            json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]})
        ));
        assert!(!ok(
            json!({"verbs": ["create"], "apiGroups": [""], "resources": ["pods"]})
        ));
        assert!(ok(
            json!({"verbs": ["update"], "apiGroups": ["apps"], "resources": ["deployments/scale"]})
        ));
        assert!(!ok(
            json!({"verbs": ["update"], "apiGroups": ["apps"], "resources": ["deployments"]})
        ));
        // A rule limited to names covers only those names, never all of them.
        assert!(ok(
            json!({"verbs": ["get"], "apiGroups": [""], "resources": ["secrets"], "resourceNames": ["s1"]})
        ));
        assert!(!ok(
            json!({"verbs": ["get"], "apiGroups": [""], "resources": ["secrets"]})
        ));
        assert!(ok(
            json!({"verbs": ["get"], "nonResourceURLs": ["/apis/apps"]})
        ));
        assert!(!ok(json!({"verbs": ["get"], "nonResourceURLs": ["/api"]})));
    }

    #[test]
    fn the_refusal_reads_as_upstreams() {
        let user = UserInfo::authenticated("bob", vec![]);
        let owner = [rule(
            json!({"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods"]}),
        )];
        let wanted = [
            rule(json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]})),
            rule(json!({"verbs": ["*"], "nonResourceURLs": ["*"]})),
        ];
        let msg = confirm_no_escalation(&user, &owner, &wanted).unwrap_err();
        assert_eq!(
            msg,
            "user \"bob\" (groups=[\"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n\
             {APIGroups:[\"*\"], Resources:[\"*\"], Verbs:[\"*\"]}\n\
             {NonResourceURLs:[\"*\"], Verbs:[\"*\"]}"
        );
        let wanted = [rule(
            json!({"verbs": ["get", "create", "delete"], "apiGroups": [""], "resources": ["pods", "secrets"]}),
        )];
        let msg = confirm_no_escalation(&user, &owner, &wanted).unwrap_err();
        assert!(
            msg.ends_with(
                "\n{APIGroups:[\"\"], Resources:[\"pods\"], Verbs:[\"create\" \"delete\"]}\n\
             {APIGroups:[\"\"], Resources:[\"secrets\"], Verbs:[\"get\" \"create\" \"delete\"]}"
            ),
            "{msg}"
        );
        assert!(confirm_no_escalation(&user, &owner, &owner).is_ok());
    }
}
