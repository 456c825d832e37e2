//! `x-kubernetes-validations`: CEL rules on a schema node, evaluated with `self` bound to the
//! value at that node (and `oldSelf` to the previous value on updates — transition rules).
//!
//! Programs come from the API server's one CEL environment ([`crate::cel`]), with
//! Kubernetes' libraries (quantity, url, ip/cidr, lists, sets, regex, format, the
//! strings extension). Covered: `rule`, `message`, `messageExpression` (a string expression over the
//! same variables; when it fails, or evaluates to an empty or multi-line string, the
//! `message` is used instead, as upstream), `fieldPath`, `reason`, transition rules (skipped
//! on create, or when the node did not exist before, unless `optionalOldSelf`), and the cost
//! budget: a rule whose estimated cost is over upstream's per-expression limit is refused
//! when the CRD is written, as are all rules whose estimated total is over the CRD-wide limit;
//! when an object is validated, each evaluation is held to the per-call limit and all of a
//! request's evaluations to its budget ([`crate::cel::cost`] says how costs are counted).
//! A rule that does not compile, or names a field its schema does not declare
//! ([`crate::cel::typecheck`]), is rejected when the CRD is written, so objects are never
//! checked against broken rules.

use serde_json::Value;
use setpoint_api::Cause;

use crate::cel::schema::Node;
use crate::cel::{self, cost, typecheck, Budget, Error};

/// Upstream's longest `messageExpression` result (`MaxEvaluatedMessageExpressionSizeBytes`).
const MAX_MESSAGE_EXPRESSION_BYTES: usize = 5 * 1024;

fn rules(schema: &Value) -> &[Value] {
    schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// Rules of a schema node that do not compile or cost too much (for validating the CRD
/// itself).
pub fn compile_errors(schema: &Value, path: &str) -> Vec<Cause> {
    rule_errors(schema, path).0
}

/// The problems of a schema node's rules, and their estimated cost (each rule's estimate
/// summed), which the CRD-wide total multiplies by the node's cardinality.
pub fn rule_errors(schema: &Value, path: &str) -> (Vec<Cause>, u64) {
    let mut out = Vec::new();
    let mut total = 0u64;
    if rules(schema).is_empty() {
        return (out, total);
    }
    let root = path
        .ends_with("openAPIV3Schema")
        .then(|| with_object_meta(schema));
    let seen = root.as_ref().unwrap_or(schema);
    let vars = [("self", Node::new(seen)), ("oldSelf", Node::new(seen))];
    for (i, r) in rules(schema).iter().enumerate() {
        let field = format!("{path}.x-kubernetes-validations[{i}].rule");
        match r.get("rule").and_then(Value::as_str) {
            None | Some("") => out.push(Cause::required(field, "")),
            Some(rule) => match cel::compile(rule) {
                Err(e) => out.push(Cause::invalid(
                    field,
                    &Value::String(rule.into()),
                    &e.to_string(),
                )),
                Ok(program) => {
                    // Upstream type-checks rules against the schema when the CRD is written.
                    let problems = typecheck::check(rule, &vars).unwrap_or_default();
                    if !problems.is_empty() {
                        out.push(Cause::invalid(
                            field,
                            &Value::String(rule.into()),
                            &format!("compilation failed: {}", problems.join("\n")),
                        ));
                        continue;
                    }
                    let estimate = cost::estimate(&program, &vars);
                    total = total.saturating_add(estimate);
                    if estimate > cel::STATIC_ESTIMATED_COST_LIMIT {
                        out.push(Cause::forbidden(
                            field,
                            &cost::exceeds_budget_message(
                                "estimated rule cost",
                                estimate,
                                cel::STATIC_ESTIMATED_COST_LIMIT,
                            ),
                        ));
                    }
                }
            },
        }
        if let Some(expr) = r.get("messageExpression").and_then(Value::as_str) {
            let field = format!("{path}.x-kubernetes-validations[{i}].messageExpression");
            match cel::compile(expr) {
                Err(Error::Compile(e)) => out.push(Cause::invalid(
                    field,
                    &Value::String(expr.into()),
                    &format!("messageExpression compilation failed: {e}"),
                )),
                Err(e) => out.push(Cause::invalid(
                    field,
                    &Value::String(expr.into()),
                    &e.to_string(),
                )),
                Ok(program) => {
                    let estimate = cost::estimate(&program, &vars);
                    total = total.saturating_add(estimate);
                    if estimate > cel::STATIC_ESTIMATED_COST_LIMIT {
                        out.push(Cause::forbidden(
                            field,
                            &cost::exceeds_budget_message(
                                "estimated messageExpression cost",
                                estimate,
                                cel::STATIC_ESTIMATED_COST_LIMIT,
                            ),
                        ));
                    }
                }
            }
        }
    }
    (out, total)
}

/// A root schema as its rules see it: with `apiVersion`, `kind` and, of `metadata`, `name`
/// and `generateName`, which upstream adds to every custom resource's root.
fn with_object_meta(schema: &Value) -> Value {
    let mut root = schema.clone();
    if let Some(props) = root.get_mut("properties").and_then(Value::as_object_mut) {
        let string = serde_json::json!({"type": "string"});
        props.entry("apiVersion").or_insert_with(|| string.clone());
        props.entry("kind").or_insert_with(|| string.clone());
        props.insert(
            "metadata".into(),
            serde_json::json!({"type": "object", "properties": {
                "name": string.clone(), "generateName": string}}),
        );
    }
    root
}

/// Evaluates a schema node's rules against `value` (and `old`, its previous value), with a
/// request budget of its own.
pub fn check(schema: &Value, value: &Value, old: Option<&Value>, path: &str) -> Vec<Cause> {
    check_within(schema, value, old, path, &mut Budget::per_request())
}

/// How a rule's failure is worded: upstream's `ruleErrorString`, the message if there is
/// one, else the rule.
fn rule_error_string(r: &Value, rule: &str) -> String {
    match r.get("message").and_then(Value::as_str).map(str::trim) {
        Some(m) if !m.is_empty() => m.to_string(),
        _ => rule.trim().to_string(),
    }
}

/// The message of a failed rule: its `messageExpression`'s result when that is a usable
/// string, else `message`, else `failed rule: <rule>`. `Err` when evaluating the
/// expression ran out of budget, which ends validation as upstream does.
fn failure_message(
    r: &Value,
    rule: &str,
    vars: &[(&str, &Value)],
    budget: &mut Budget,
) -> Result<String, String> {
    if let Some(expr) = r.get("messageExpression").and_then(Value::as_str) {
        let result = cel::compile(expr).and_then(|p| cel::evaluate(&p, vars, budget));
        match result {
            Ok(::cel::Value::String(s)) => {
                let s = s.trim();
                // Upstream falls back to `message` for an empty, multi-line or too long one.
                if !s.is_empty() && !s.contains('\n') && s.len() <= MAX_MESSAGE_EXPRESSION_BYTES {
                    return Ok(s.to_string());
                }
            }
            Err(Error::BudgetExhausted) => {
                return Err("messageExpression evaluation failed due to running out of cost budget, no further validation rules will be run".into());
            }
            Err(Error::CallCostExceeded) => {
                return Err(format!(
                    "no further validation rules will be run due to call cost exceeds limit for messageExpression: {expr:?}"
                ));
            }
            // Other errors and non-strings fall back to the static message.
            _ => {}
        }
    }
    Ok(
        match r.get("message").and_then(Value::as_str).map(str::trim) {
            Some(m) if !m.is_empty() => m.to_string(),
            _ => format!("failed rule: {}", rule.trim()),
        },
    )
}

/// How upstream shows the value of a failed rule: objects and arrays by their type only.
fn shown(value: &Value) -> Value {
    match value {
        Value::Object(_) => Value::String("object".into()),
        Value::Array(_) => Value::String("array".into()),
        other => other.clone(),
    }
}

/// Evaluates a schema node's rules against `value` (and `old`), drawing from `budget`, the
/// request's: once it is spent, one cause says so and no further rule is evaluated.
pub fn check_within(
    schema: &Value,
    value: &Value,
    old: Option<&Value>,
    path: &str,
    budget: &mut Budget,
) -> Vec<Cause> {
    let mut out = Vec::new();
    let rules = rules(schema);
    if rules.is_empty() || budget.exhausted() {
        return out;
    }
    let node_field = if path.is_empty() { "<root>" } else { path };
    for r in rules {
        let Some(rule) = r.get("rule").and_then(Value::as_str) else {
            continue;
        };
        let program = match cel::compile(rule) {
            Ok(p) => p,
            Err(e) => {
                out.push(Cause::invalid(
                    node_field,
                    &shown(value),
                    &format!("rule compile error: {e}"),
                ));
                continue;
            }
        };
        let transition = program.uses_variable("oldSelf");
        let optional_old = r.get("optionalOldSelf").and_then(Value::as_bool) == Some(true);
        if transition && old.is_none() && !optional_old {
            continue;
        }
        let mut vars: Vec<(&str, &Value)> = vec![("self", value)];
        if let Some(o) = old {
            vars.push(("oldSelf", o));
        }
        match cel::evaluate(&program, &vars, budget) {
            Ok(::cel::Value::Bool(true)) => {}
            Ok(::cel::Value::Bool(false)) => {
                let field = match r.get("fieldPath").and_then(Value::as_str) {
                    Some(fp) if !fp.is_empty() => format!("{path}{fp}"),
                    _ => node_field.to_string(),
                };
                let detail = match failure_message(r, rule, &vars, budget) {
                    Ok(d) => d,
                    Err(stop) => {
                        out.push(Cause::invalid(field, &shown(value), &stop));
                        return out;
                    }
                };
                out.push(match r.get("reason").and_then(Value::as_str) {
                    Some("FieldValueForbidden") => Cause::forbidden(field, &detail),
                    Some("FieldValueRequired") => Cause::required(field, &detail),
                    Some("FieldValueDuplicate") => Cause::duplicate(field, &shown(value)),
                    _ => Cause::invalid(field, &shown(value), &detail),
                });
            }
            Ok(other) => out.push(Cause::invalid(
                node_field,
                &shown(value),
                &format!(
                    "rule did not evaluate to a bool: it evaluated to a {} evaluating rule: {}",
                    other.type_of(),
                    rule_error_string(r, rule)
                ),
            )),
            Err(Error::BudgetExhausted) => {
                out.push(Cause::invalid(
                    node_field,
                    &shown(value),
                    &Error::BudgetExhausted.to_string(),
                ));
                return out;
            }
            Err(Error::CallCostExceeded) => {
                out.push(Cause::invalid(
                    node_field,
                    &shown(value),
                    &format!(
                        "'{}': no further validation rules will be run due to call cost exceeds limit for rule: {}",
                        cel::ACTUAL_COST_LIMIT_EXCEEDED,
                        rule_error_string(r, rule)
                    ),
                ));
                return out;
            }
            Err(e) => out.push(Cause::invalid(
                node_field,
                &shown(value),
                &format!("{e} evaluating rule: {}", rule_error_string(r, rule)),
            )),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({"type": "object", "x-kubernetes-validations": [
            {"rule": "self.minReplicas <= self.maxReplicas", "message": "minReplicas must not exceed maxReplicas"},
            {"rule": "self.name.startsWith('app-')", "fieldPath": ".name"},
            {"rule": "self.maxReplicas >= oldSelf.maxReplicas", "message": "maxReplicas cannot shrink"},
        ]})
    }

    #[test]
    fn rules_pass_and_fail_with_their_messages() {
        let ok = json!({"minReplicas": 1, "maxReplicas": 3, "name": "app-x"});
        assert!(check(&schema(), &ok, None, "spec").is_empty());
        let bad = json!({"minReplicas": 5, "maxReplicas": 3, "name": "x"});
        let causes = check(&schema(), &bad, None, "spec");
        assert_eq!(causes.len(), 2, "{causes:?}");
        assert_eq!(causes[0].field, "spec");
        assert_eq!(
            causes[0].message,
            "Invalid value: \"object\": minReplicas must not exceed maxReplicas"
        );
        assert_eq!(causes[1].field, "spec.name");
        assert!(causes[1]
            .message
            .contains("failed rule: self.name.startsWith('app-')"));
    }

    /// The fuzzer's finding: a rule that fails on a map literal was reported with the map's
    /// entries in random order. Errors name the types only, the same every time.
    #[test]
    fn evaluation_errors_name_types_not_values() {
        let rule = r#"size(self) > 0*{"b": 1, "a": {"c": true}, "d": "x", "e": [1]}"#;
        let s = json!({"type": "object", "x-kubernetes-validations": [{"rule": rule}]});
        let first = check(&s, &json!({}), None, "spec");
        for _ in 0..20 {
            assert_eq!(check(&s, &json!({}), None, "spec"), first);
        }
        assert_eq!(first.len(), 1);
        assert!(
            first[0].message.ends_with(&format!(
                "no such overload: int mul map evaluating rule: {rule}"
            )),
            "{}",
            first[0].message
        );
        let s = json!({"type": "object", "x-kubernetes-validations": [{"rule": "{'a': 1}"}]});
        let causes = check(&s, &json!({}), None, "spec");
        assert!(
            causes[0]
                .message
                .contains("did not evaluate to a bool: it evaluated to a map"),
            "{causes:?}"
        );
    }

    #[test]
    fn transition_rules_need_an_old_value() {
        let new = json!({"minReplicas": 1, "maxReplicas": 2, "name": "app-x"});
        let old = json!({"minReplicas": 1, "maxReplicas": 3, "name": "app-x"});
        assert!(
            check(&schema(), &new, None, "spec").is_empty(),
            "skipped on create"
        );
        let causes = check(&schema(), &new, Some(&old), "spec");
        assert_eq!(causes.len(), 1);
        assert!(causes[0].message.contains("maxReplicas cannot shrink"));
    }

    #[test]
    fn broken_rules_are_reported_when_the_crd_is_written() {
        let s = json!({"x-kubernetes-validations": [
            {"rule": "self.x =="},
            {"rule": "size(self) > 0"},
            {"rule": "true", "messageExpression": "'a' +"},
        ]});
        let errors = compile_errors(&s, "spec.versions[0].schema.openAPIV3Schema");
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[0]
            .field
            .ends_with("x-kubernetes-validations[0].rule"));
        assert!(errors[1]
            .field
            .ends_with("x-kubernetes-validations[2].messageExpression"));
        assert!(errors[1]
            .message
            .contains("messageExpression compilation failed"));
    }

    #[test]
    fn rules_naming_undeclared_fields_are_refused_when_the_crd_is_written() {
        let s = json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {"replicas": {"type": "integer"}}},
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
        "x-kubernetes-validations": [
            {"rule": "self.spec.replica > 0"},
            {"rule": "self.spec.replicas > 0 && self.status.anything == 1"},
            {"rule": "self.metadata.name.startsWith('a') && self.kind == 'X'"},
            {"rule": "self.metadata.labels.size() > 0"},
            {"rule": "self.spec.replicas == 'three'"},
        ]});
        let errors = compile_errors(&s, "spec.versions[0].schema.openAPIV3Schema");
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.versions[0].schema.openAPIV3Schema.x-kubernetes-validations[0].rule",
                "spec.versions[0].schema.openAPIV3Schema.x-kubernetes-validations[3].rule",
                "spec.versions[0].schema.openAPIV3Schema.x-kubernetes-validations[4].rule",
            ],
            "{errors:?}"
        );
        assert_eq!(
            errors[0].message,
            "Invalid value: \"self.spec.replica > 0\": compilation failed: ERROR: <input>:1:10: \
             undefined field 'replica'\n | self.spec.replica > 0\n | .........^"
        );
        assert!(errors[1].message.contains("undefined field 'labels'"));
    }

    #[test]
    fn message_expressions_word_failures_and_fall_back_to_the_message() {
        let s = json!({"type": "object", "x-kubernetes-validations": [
            {"rule": "self.replicas <= 10", "message": "too many",
             "messageExpression": "'replicas ' + string(self.replicas) + ' is over 10'"},
            {"rule": "self.replicas <= 10", "message": "static one",
             "messageExpression": "self.nope + 'x'"},
            {"rule": "self.replicas <= 10", "message": "empty falls back", "messageExpression": "' '"},
            {"rule": "self.replicas <= 10", "messageExpression": "'a\\nb'"},
        ]});
        let causes = check(&s, &json!({"replicas": 12}), None, "spec");
        let messages: Vec<&str> = causes.iter().map(|c| c.message.as_str()).collect();
        assert_eq!(
            messages,
            [
                "Invalid value: \"object\": replicas 12 is over 10",
                "Invalid value: \"object\": static one",
                "Invalid value: \"object\": empty falls back",
                "Invalid value: \"object\": failed rule: self.replicas <= 10",
            ]
        );
    }

    #[test]
    fn reasons_choose_the_cause() {
        let s = json!({"type": "object", "x-kubernetes-validations": [
            {"rule": "false", "message": "no", "reason": "FieldValueForbidden", "fieldPath": ".a"},
            {"rule": "false", "message": "needed", "reason": "FieldValueRequired"},
            {"rule": "false", "reason": "FieldValueDuplicate"},
        ]});
        let causes = check(&s, &json!({"a": 1}), None, "spec");
        assert_eq!(causes[0].reason, "FieldValueForbidden");
        assert_eq!(causes[0].field, "spec.a");
        assert_eq!(causes[0].message, "Forbidden: no");
        assert_eq!(causes[1].message, "Required value: needed");
        assert_eq!(causes[2].reason, "FieldValueDuplicate");
    }

    #[test]
    fn rules_over_the_estimated_cost_limit_are_refused() {
        let unbounded = json!({"type": "array", "items": {"type": "string"},
            "x-kubernetes-validations": [{"rule": "self.all(a, self.all(b, a == b))"}]});
        let errors = compile_errors(&unbounded, "spec");
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].reason, "FieldValueForbidden");
        assert!(
            errors[0].message.starts_with(
                "Forbidden: estimated rule cost exceeds budget by factor of more than 100x (try simplifying the rule"
            ),
            "{}",
            errors[0].message
        );
        let bounded = json!({"type": "array", "maxItems": 10,
            "items": {"type": "string", "maxLength": 10},
            "x-kubernetes-validations": [{"rule": "self.all(a, self.all(b, a == b))"}]});
        assert!(compile_errors(&bounded, "spec").is_empty());
    }

    #[test]
    fn a_spent_budget_stops_validation_with_one_cause() {
        let s = json!({"type": "array", "x-kubernetes-validations": [
            {"rule": "self.all(x, x > 0)"}, {"rule": "self.all(x, x > 1)"}]});
        let value = json!((1..200).collect::<Vec<_>>());
        let mut budget = Budget::new(500);
        let causes = check_within(&s, &value, None, "spec", &mut budget);
        assert_eq!(causes.len(), 1, "{causes:?}");
        assert_eq!(
            causes[0].message,
            "Invalid value: \"array\": validation failed due to running out of cost budget, no further validation rules will be run"
        );
        assert!(check_within(&s, &value, None, "spec", &mut budget).is_empty());
    }

    #[test]
    fn kubernetes_libraries_are_available_to_rules() {
        let s = json!({"type": "object", "x-kubernetes-validations": [
            {"rule": "quantity(self.memory).isLessThan(quantity('1Gi'))", "message": "at most 1Gi"},
            {"rule": "isCIDR(self.cidr) && cidr(self.cidr).containsIP(self.ip)"},
            {"rule": "url(self.endpoint).getScheme() == 'https'"},
            {"rule": "self.tags.isSorted() && sets.contains(self.tags, ['a'])"},
            {"rule": "self.name.lowerAscii() == self.name"},
        ]});
        let ok = json!({"memory": "512Mi", "cidr": "10.0.0.0/8", "ip": "10.1.2.3",
            "endpoint": "https://example.com/x", "tags": ["a", "b"], "name": "web"});
        assert_eq!(check(&s, &ok, None, "spec"), Vec::<Cause>::new());
        let bad = json!({"memory": "2Gi", "cidr": "10.0.0.0/8", "ip": "11.1.2.3",
            "endpoint": "http://example.com/x", "tags": ["b", "a"], "name": "Web"});
        assert_eq!(check(&s, &bad, None, "spec").len(), 5);
    }
}
