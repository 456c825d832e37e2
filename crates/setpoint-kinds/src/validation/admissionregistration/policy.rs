//! ValidatingAdmissionPolicy and ValidatingAdmissionPolicyBinding
//! (`admissionregistration.k8s.io/v1`): upstream's `validateValidatingAdmissionPolicySpec`
//! and `validateValidatingAdmissionPolicyBindingSpec`, with their messages.
//!
//! CEL expressions are checked for presence here; whether they compile is the API server's
//! concern (this crate has no CEL), reported in the policy's `status.typeChecking`.

use std::collections::HashSet;

use serde_json::{json, Value};
use setpoint_api::Cause;

use super::rule_with_operations;

use super::super::fields::{arr, at, child, index, label_selector, optional_enum, s};

/// The `reason`s a validation may give its denial.
const REASONS: &[&str] = &[
    "Unauthorized",
    "Forbidden",
    "Invalid",
    "RequestEntityTooLarge",
];
/// A binding's `validationActions`.
const ACTIONS: &[&str] = &["Deny", "Warn", "Audit"];

/// `ValidatingAdmissionPolicy.spec`.
pub(in crate::validation) fn policy(e: &mut Vec<Cause>, obj: &Value) {
    let spec = at(obj, "spec");
    optional_enum(
        e,
        spec,
        "failurePolicy",
        "spec.failurePolicy",
        &["Fail", "Ignore"],
    );
    let param_kind = at(spec, "paramKind");
    if !param_kind.is_null() {
        for field in ["apiVersion", "kind"] {
            if s(param_kind, field).is_empty() {
                e.push(Cause::required(child("spec.paramKind", field), ""));
            }
        }
    }
    let constraints = at(spec, "matchConstraints");
    if constraints.is_null() {
        e.push(Cause::required("spec.matchConstraints", ""));
    } else {
        match_resources(e, constraints, "spec.matchConstraints", true);
    }
    let validations = arr(spec, "validations");
    let annotations = arr(spec, "auditAnnotations");
    if validations.is_empty() && annotations.is_empty() {
        e.push(Cause::required(
            "spec.validations",
            "validations or auditAnnotations must contain at least one item",
        ));
    }
    for (i, v) in validations.iter().enumerate() {
        let p = index("spec.validations", i);
        if s(v, "expression").trim().is_empty() {
            e.push(Cause::required(child(&p, "expression"), ""));
        }
        let message = s(v, "message");
        if message.contains('\n') {
            e.push(Cause::invalid(
                child(&p, "message"),
                &json!(message),
                "message must not contain line breaks",
            ));
        } else if !message.is_empty() && message.trim().is_empty() {
            e.push(Cause::invalid(
                child(&p, "message"),
                &json!(message),
                "message must be non-empty if specified",
            ));
        }
        optional_enum(e, v, "reason", &child(&p, "reason"), REASONS);
    }
    let mut keys = HashSet::new();
    for (i, a) in annotations.iter().enumerate() {
        let p = index("spec.auditAnnotations", i);
        let key = s(a, "key");
        if key.is_empty() {
            e.push(Cause::required(child(&p, "key"), ""));
        } else if !keys.insert(key) {
            e.push(Cause::duplicate(child(&p, "key"), &json!(key)));
        }
        if s(a, "valueExpression").trim().is_empty() {
            e.push(Cause::required(child(&p, "valueExpression"), ""));
        }
    }
    named_expressions(e, arr(spec, "matchConditions"), "spec.matchConditions");
    let mut names = HashSet::new();
    for (i, v) in arr(spec, "variables").iter().enumerate() {
        let p = index("spec.variables", i);
        let name = s(v, "name");
        if name.is_empty() {
            e.push(Cause::required(child(&p, "name"), ""));
        } else if !is_cel_identifier(name) {
            e.push(Cause::invalid(
                child(&p, "name"),
                &json!(name),
                "name is not a valid CEL identifier",
            ));
        } else if !names.insert(name) {
            e.push(Cause::duplicate(child(&p, "name"), &json!(name)));
        }
        if s(v, "expression").trim().is_empty() {
            e.push(Cause::required(child(&p, "expression"), ""));
        }
    }
}

/// `ValidatingAdmissionPolicyBinding.spec`.
pub(in crate::validation) fn binding(e: &mut Vec<Cause>, obj: &Value) {
    let spec = at(obj, "spec");
    if s(spec, "policyName").is_empty() {
        e.push(Cause::required("spec.policyName", ""));
    }
    let actions = arr(spec, "validationActions");
    if actions.is_empty() {
        e.push(Cause::required(
            "spec.validationActions",
            "at least one validation action is required",
        ));
    }
    let mut seen = HashSet::new();
    for (i, a) in actions.iter().enumerate() {
        let p = index("spec.validationActions", i);
        let a = a.as_str().unwrap_or("");
        if !ACTIONS.contains(&a) {
            e.push(Cause::not_supported(p, &json!(a), ACTIONS));
        } else if !seen.insert(a) {
            e.push(Cause::duplicate(p, &json!(a)));
        }
    }
    if seen.contains("Deny") && seen.contains("Warn") {
        e.push(Cause::invalid(
            "spec.validationActions",
            at(spec, "validationActions"),
            "must not contain both Deny and Warn (repeating the same validation failure \
             information in the API response and headers serves no purpose)",
        ));
    }
    let param_ref = at(spec, "paramRef");
    if !param_ref.is_null() {
        let p = "spec.paramRef";
        let named = !s(param_ref, "name").is_empty();
        let selector = at(param_ref, "selector");
        match (named, selector.is_null()) {
            (true, false) => e.push(Cause::forbidden(
                child(p, "name"),
                "name and selector are mutually exclusive",
            )),
            (false, true) => e.push(Cause::required(
                p,
                "one of name or selector must be specified",
            )),
            (false, false) => label_selector(e, selector, &child(p, "selector")),
            (true, true) => {}
        }
        match at(param_ref, "parameterNotFoundAction").as_str() {
            None => e.push(Cause::required(child(p, "parameterNotFoundAction"), "")),
            Some(a) if a != "Allow" && a != "Deny" => e.push(Cause::not_supported(
                child(p, "parameterNotFoundAction"),
                &json!(a),
                &["Allow", "Deny"],
            )),
            Some(_) => {}
        }
    }
    let resources = at(spec, "matchResources");
    if !resources.is_null() {
        match_resources(e, resources, "spec.matchResources", false);
    }
}

/// `MatchResources`: the policy's `matchConstraints` must name resource rules, a binding's
/// `matchResources` may leave them to the policy.
fn match_resources(e: &mut Vec<Cause>, m: &Value, path: &str, rules_required: bool) {
    let rules = arr(m, "resourceRules");
    if rules_required && rules.is_empty() {
        e.push(Cause::required(child(path, "resourceRules"), ""));
    }
    for key in ["resourceRules", "excludeResourceRules"] {
        for (i, rule) in arr(m, key).iter().enumerate() {
            let p = index(&child(path, key), i);
            rule_with_operations(e, rule, &p);
            for (j, n) in arr(rule, "resourceNames").iter().enumerate() {
                if n.as_str().is_none_or(str::is_empty) {
                    e.push(Cause::required(index(&child(&p, "resourceNames"), j), ""));
                }
            }
        }
    }
    optional_enum(
        e,
        m,
        "matchPolicy",
        &child(path, "matchPolicy"),
        &["Equivalent", "Exact"],
    );
    for key in ["namespaceSelector", "objectSelector"] {
        let sel = at(m, key);
        if !sel.is_null() {
            label_selector(e, sel, &child(path, key));
        }
    }
}

/// `matchConditions`: named, unique, with an expression.
fn named_expressions(e: &mut Vec<Cause>, items: &[Value], path: &str) {
    let mut names = HashSet::new();
    for (i, c) in items.iter().enumerate() {
        let p = index(path, i);
        let name = s(c, "name");
        if name.is_empty() {
            e.push(Cause::required(child(&p, "name"), ""));
        } else if !names.insert(name) {
            e.push(Cause::duplicate(child(&p, "name"), &json!(name)));
        }
        if s(c, "expression").trim().is_empty() {
            e.push(Cause::required(child(&p, "expression"), ""));
        }
    }
}

/// A CEL identifier: a letter or `_`, then letters, digits and `_`.
fn is_cel_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(f: fn(&mut Vec<Cause>, &Value), obj: Value) -> Vec<String> {
        let mut e = Vec::new();
        f(&mut e, &obj);
        e.iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect()
    }

    #[test]
    fn a_policy_needs_constraints_and_a_validation() {
        let errs = messages(policy, json!({"spec": {}}));
        assert!(
            errs.contains(&"spec.matchConstraints: Required value".to_string()),
            "{errs:?}"
        );
        assert!(errs.contains(
            &"spec.validations: Required value: validations or auditAnnotations must contain at least one item".to_string()
        ), "{errs:?}");
        let ok = json!({"spec": {
            "matchConstraints": {"resourceRules": [{"operations": ["CREATE"], "apiGroups": ["apps"],
                "apiVersions": ["v1"], "resources": ["deployments"]}]},
            "validations": [{"expression": "object.spec.replicas <= 5", "reason": "Forbidden"}],
            "variables": [{"name": "replicas", "expression": "object.spec.replicas"}]}});
        assert!(messages(policy, ok).is_empty());
        let bad = json!({"spec": {
            "matchConstraints": {"resourceRules": [{"operations": ["CREATE"], "apiGroups": ["apps"],
                "apiVersions": ["v1"], "resources": ["deployments"]}]},
            "validations": [{"expression": "true", "reason": "Teapot", "message": "a\nb"}],
            "variables": [{"name": "not-cel", "expression": "1"}]}});
        let errs = messages(policy, bad);
        assert_eq!(errs.len(), 3, "{errs:?}");
        assert!(errs[0].starts_with("spec.validations[0].message: Invalid value"));
        assert!(errs[1].starts_with("spec.validations[0].reason: Unsupported value: \"Teapot\""));
        assert!(errs[2].ends_with("name is not a valid CEL identifier"));
    }

    #[test]
    fn a_binding_names_its_policy_actions_and_params() {
        let errs = messages(binding, json!({"spec": {}}));
        assert_eq!(
            errs,
            [
                "spec.policyName: Required value",
                "spec.validationActions: Required value: at least one validation action is required"
            ]
        );
        let errs = messages(
            binding,
            json!({"spec": {"policyName": "p", "validationActions": ["Deny", "Warn", "Deny"],
                "paramRef": {"name": "x", "selector": {}}}}),
        );
        assert_eq!(errs.len(), 4, "{errs:?}");
        assert!(errs[0].starts_with("spec.validationActions[2]: Duplicate value"));
        assert!(errs[1].contains("must not contain both Deny and Warn"));
        assert_eq!(
            errs[2],
            "spec.paramRef.name: Forbidden: name and selector are mutually exclusive"
        );
        assert_eq!(
            errs[3],
            "spec.paramRef.parameterNotFoundAction: Required value"
        );
    }
}
