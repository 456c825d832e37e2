//! Printers for `rbac.authorization.k8s.io`: Roles and ClusterRoles show when they were
//! created; bindings show the role they grant and, wide, whom they grant it to.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::{age, arr_at, at, col, name_cell, str_at, time_at, wide, Column, AGE, NAME};

/// Role and ClusterRole.
pub(super) const ROLE: &[Column] = &[
    NAME,
    col("Created At", "date", "When the object was created."),
];

pub(super) fn role(r: &Value, _now: DateTime<Utc>) -> Vec<Value> {
    // Upstream prints the creation timestamp itself (RFC 3339), not an age.
    let created = match time_at(r, "metadata.creationTimestamp") {
        Some(t) => Value::from(t.format("%Y-%m-%dT%H:%M:%SZ").to_string()),
        None => at(r, "metadata.creationTimestamp")
            .cloned()
            .unwrap_or(Value::Null),
    };
    vec![name_cell(r), created]
}

/// RoleBinding and ClusterRoleBinding.
pub(super) const BINDING: &[Column] = &[
    NAME,
    col("Role", "string", "The role the binding grants."),
    AGE,
    wide("Users", "string", "Users the binding grants the role to."),
    wide("Groups", "string", "Groups the binding grants the role to."),
    wide(
        "ServiceAccounts",
        "string",
        "ServiceAccounts the binding grants the role to.",
    ),
];

pub(super) fn role_binding(b: &Value, now: DateTime<Utc>) -> Vec<Value> {
    binding(b, now)
}

pub(super) fn cluster_role_binding(b: &Value, now: DateTime<Utc>) -> Vec<Value> {
    binding(b, now)
}

fn binding(b: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let role = format!(
        "{}/{}",
        str_at(b, "roleRef.kind"),
        str_at(b, "roleRef.name")
    );
    let (mut users, mut groups, mut sas) = (Vec::new(), Vec::new(), Vec::new());
    for s in arr_at(b, "subjects") {
        let name = str_at(s, "name").to_string();
        match str_at(s, "kind") {
            "User" => users.push(name),
            "Group" => groups.push(name),
            "ServiceAccount" => {
                // `namespace/name`, or the bare name when the subject names no namespace.
                let ns = str_at(s, "namespace");
                sas.push(if ns.is_empty() {
                    name
                } else {
                    format!("{ns}/{name}")
                });
            }
            _ => {}
        }
    }
    vec![
        name_cell(b),
        Value::from(role),
        age(b, now),
        Value::from(users.join(", ")),
        Value::from(groups.join(", ")),
        Value::from(sas.join(", ")),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bindings_print_role_and_subjects() {
        let now = Utc::now();
        let b = json!({"metadata": {"name": "read", "namespace": "a",
                "creationTimestamp": (now - chrono::Duration::minutes(5)).to_rfc3339()},
            "roleRef": {"kind": "Role", "name": "pod-reader"},
            "subjects": [{"kind": "User", "name": "alice"}, {"kind": "User", "name": "bob"},
                {"kind": "Group", "name": "devs"},
                {"kind": "ServiceAccount", "name": "bot", "namespace": "a"}]});
        let cells = binding(&b, now);
        assert_eq!(
            cells,
            vec![
                json!("read"),
                json!("Role/pod-reader"),
                json!("5m"),
                json!("alice, bob"),
                json!("devs"),
                json!("a/bot")
            ]
        );
        let r = json!({"metadata": {"name": "view", "creationTimestamp": "2026-01-02T03:04:05Z"}});
        assert_eq!(
            role(&r, now),
            vec![json!("view"), json!("2026-01-02T03:04:05Z")]
        );
    }
}
