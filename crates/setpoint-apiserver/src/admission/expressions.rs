//! Compiling the CEL expressions of admission configurations when they are written, as
//! upstream's API server does: a webhook configuration's `matchConditions` and every
//! expression of a ValidatingAdmissionPolicy must compile with the variables their context
//! declares, or the write is refused (422). Type errors against schemas are not refused
//! here: a policy reports them in `status.typeChecking`.

use serde_json::Value;
use setpoint_api::Cause;

use crate::cel;
use crate::registry::ResourceDef;

const GROUP: &str = "admissionregistration.k8s.io";

/// What a webhook's `matchConditions` can name.
const WEBHOOK_VARIABLES: &[&str] = &["object", "oldObject", "request", "authorizer"];
/// What a ValidatingAdmissionPolicy's expressions can name.
const POLICY_VARIABLES: &[&str] = &[
    "object",
    "oldObject",
    "request",
    "authorizer",
    "params",
    "namespaceObject",
    "variables",
];

/// The expressions of `obj` (a written object of `res`) that do not compile; empty for
/// kinds that hold no expressions.
pub fn validate(res: &ResourceDef, obj: &Value) -> Vec<Cause> {
    if res.group != GROUP {
        return Vec::new();
    }
    let (expressions, declared) = match res.kind.as_str() {
        "ValidatingWebhookConfiguration" | "MutatingWebhookConfiguration" => {
            (webhook_expressions(obj), WEBHOOK_VARIABLES)
        }
        "ValidatingAdmissionPolicy" => (
            crate::admission::policy::expressions_of(obj),
            POLICY_VARIABLES,
        ),
        _ => return Vec::new(),
    };
    compile_errors(&expressions, declared)
}

/// `webhooks[i].matchConditions[j].expression` of a webhook configuration, with its path.
fn webhook_expressions(obj: &Value) -> Vec<(String, String)> {
    let list = |v: &Value, key: &str| v.get(key).and_then(Value::as_array).cloned();
    let mut out = Vec::new();
    for (i, webhook) in list(obj, "webhooks").unwrap_or_default().iter().enumerate() {
        for (j, c) in list(webhook, "matchConditions")
            .unwrap_or_default()
            .iter()
            .enumerate()
        {
            if let Some(e) = c.get("expression").and_then(Value::as_str) {
                out.push((
                    format!("webhooks[{i}].matchConditions[{j}].expression"),
                    e.into(),
                ));
            }
        }
    }
    out
}

/// An `Invalid` cause for each expression that does not compile. Empty expressions are left
/// to the kind's field validation, which requires them.
fn compile_errors(expressions: &[(String, String)], declared: &[&str]) -> Vec<Cause> {
    expressions
        .iter()
        .filter(|(_, e)| !e.is_empty())
        .filter_map(|(path, e)| {
            let err = cel::compile_declared(e, declared).err()?;
            Some(Cause::invalid(
                path.clone(),
                &Value::String(e.clone()),
                &err.to_string(),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(kind: &str, obj: Value) -> Vec<Cause> {
        let registry = crate::registry::Registry::builtin();
        let res = registry.by_kind(GROUP, "v1", kind).expect("built-in kind");
        validate(res, &obj)
    }

    #[test]
    fn policy_expressions_that_do_not_compile_are_refused() {
        let causes = check(
            "ValidatingAdmissionPolicy",
            json!({"spec": {
                "variables": [{"name": "n", "expression": "params.data.max"}],
                "matchConditions": [{"name": "m", "expression": "namespaceObject != null"}],
                "validations": [
                    {"expression": "object.spec.replicas >"},
                    {"expression": "variables.n > 1", "messageExpression": "'x' + nope"},
                    {"expression": "object.spec.replica > 1"}],
                "auditAnnotations": [{"key": "k", "valueExpression": "request.name"}]}}),
        );
        let fields: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.validations[0].expression",
                "spec.validations[1].messageExpression"
            ]
        );
        assert!(
            causes[0].message.starts_with(
                "Invalid value: \"object.spec.replicas >\": compilation failed: ERROR: <input>:1:"
            ),
            "{}",
            causes[0].message
        );
        assert!(causes[1]
            .message
            .contains("undeclared reference to 'nope' (in container '')"));
    }

    #[test]
    fn webhook_match_conditions_cannot_name_params() {
        for kind in [
            "ValidatingWebhookConfiguration",
            "MutatingWebhookConfiguration",
        ] {
            let causes = check(
                kind,
                json!({"webhooks": [
                    {"name": "a", "matchConditions": [
                        {"name": "ok", "expression": "request.operation == 'CREATE'"}]},
                    {"name": "b", "matchConditions": [
                        {"name": "ok", "expression": "authorizer.serviceAccount('ns', 'sa') != null"},
                        {"name": "bad", "expression": "params.x == 1"},
                        {"name": "empty", "expression": ""}]}]}),
            );
            assert_eq!(causes.len(), 1, "{causes:?}");
            assert_eq!(causes[0].field, "webhooks[1].matchConditions[1].expression");
            assert!(causes[0]
                .message
                .contains("undeclared reference to 'params'"));
        }
    }

    #[test]
    fn other_kinds_hold_no_expressions() {
        assert!(check(
            "ValidatingAdmissionPolicyBinding",
            json!({"spec": {"policyName": "p"}})
        )
        .is_empty());
    }
}
