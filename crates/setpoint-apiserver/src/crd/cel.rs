//! `x-kubernetes-validations`: CEL rules on a schema node, evaluated with `self` bound to the
//! value at that node (and `oldSelf` to the previous value on updates — transition rules).
//!
//! What is covered: the CEL language and its standard functions as the `cel` crate
//! implements them (comparisons, arithmetic, `size`, `has`, `in`, `all`/`exists`/
//! `exists_one`/`map`/`filter`, `matches`, `startsWith`/`endsWith`/`contains`, `int`/
//! `string`/`double` conversions, `timestamp`/`duration`), `message`, `fieldPath`, `reason`,
//! and transition rules (skipped on create, or when the node did not exist before, unless
//! `optionalOldSelf`). Not covered: Kubernetes' extension libraries (`quantity`, `url`, `ip`,
//! `cidr`, the `lists`/`sets`/`strings` extensions such as `lowerAscii`), `messageExpression`
//! (the static `message` is used), and the cost budget. A rule that does not compile is
//! rejected when the CRD is written, so objects are never checked against broken rules.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use serde_json::Value;
use setpoint_api::Cause;

/// Compiled rules by source text (rules repeat across objects; compiling is the costly part).
static PROGRAMS: LazyLock<Mutex<HashMap<String, Arc<cel::Program>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));
/// The most compiled rules kept; beyond it the cache starts over.
const MAX_CACHED: usize = 1024;

fn compile(rule: &str) -> Result<Arc<cel::Program>, String> {
    let mut cache = PROGRAMS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = cache.get(rule) {
        return Ok(p.clone());
    }
    let program = Arc::new(cel::Program::compile(rule).map_err(|e| e.to_string())?);
    if cache.len() >= MAX_CACHED {
        cache.clear();
    }
    cache.insert(rule.to_string(), program.clone());
    Ok(program)
}

fn rules(schema: &Value) -> &[Value] {
    schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// Rules of a schema node that do not compile (for validating the CRD itself).
pub fn compile_errors(schema: &Value, path: &str) -> Vec<Cause> {
    let mut out = Vec::new();
    for (i, r) in rules(schema).iter().enumerate() {
        let field = format!("{path}.x-kubernetes-validations[{i}].rule");
        match r.get("rule").and_then(Value::as_str) {
            None | Some("") => out.push(Cause::required(field, "")),
            Some(rule) => {
                if let Err(e) = compile(rule) {
                    out.push(Cause::invalid(
                        field,
                        &Value::String(rule.into()),
                        &format!("compilation failed: {e}"),
                    ));
                }
            }
        }
    }
    out
}

/// Evaluates a schema node's rules against `value` (and `old`, its previous value).
pub fn check(schema: &Value, value: &Value, old: Option<&Value>, path: &str) -> Vec<Cause> {
    let mut out = Vec::new();
    for r in rules(schema) {
        let Some(rule) = r.get("rule").and_then(Value::as_str) else {
            continue;
        };
        let field = match r.get("fieldPath").and_then(Value::as_str) {
            Some(fp) if !fp.is_empty() => format!("{path}{fp}"),
            _ => path.to_string(),
        };
        let field = if field.is_empty() {
            "<root>".to_string()
        } else {
            field
        };
        let program = match compile(rule) {
            Ok(p) => p,
            Err(e) => {
                out.push(Cause::invalid(
                    field,
                    value,
                    &format!("rule does not compile: {e}"),
                ));
                continue;
            }
        };
        let transition = program.references().variables().contains(&"oldSelf");
        let optional_old = r.get("optionalOldSelf").and_then(Value::as_bool) == Some(true);
        if transition && old.is_none() && !optional_old {
            continue;
        }
        let mut ctx = cel::Context::default();
        let bind = |ctx: &mut cel::Context, name: &str, v: &Value| -> Result<(), String> {
            let cv = cel::to_value(v).map_err(|e| e.to_string())?;
            ctx.add_variable(name, cv).map_err(|e| e.to_string())
        };
        if let Err(e) = bind(&mut ctx, "self", value) {
            out.push(Cause::invalid(field, value, &e));
            continue;
        }
        if let Some(o) = old {
            if let Err(e) = bind(&mut ctx, "oldSelf", o) {
                out.push(Cause::invalid(field, value, &e));
                continue;
            }
        }
        let message = r
            .get("message")
            .and_then(Value::as_str)
            .map(String::from)
            .unwrap_or_else(|| format!("failed rule: {rule}"));
        let reason = match r.get("reason").and_then(Value::as_str) {
            Some("FieldValueForbidden") => "FieldValueForbidden",
            Some("FieldValueRequired") => "FieldValueRequired",
            Some("FieldValueDuplicate") => "FieldValueDuplicate",
            _ => "FieldValueInvalid",
        };
        match program.execute(&ctx) {
            Ok(cel::Value::Bool(true)) => {}
            Ok(cel::Value::Bool(false)) => {
                let shown = match value {
                    Value::Object(_) => "\"object\"".to_string(),
                    Value::Array(_) => "\"array\"".to_string(),
                    other => other.to_string(),
                };
                out.push(Cause::new(
                    reason,
                    field,
                    format!("Invalid value: {shown}: {message}"),
                ));
            }
            Ok(other) => out.push(Cause::invalid(
                field,
                value,
                &format!(
                    "rule {rule:?} did not evaluate to a bool: it evaluated to a {}",
                    other.type_of()
                ),
            )),
            Err(e) => out.push(Cause::invalid(
                field,
                value,
                &format!("rule {rule:?} failed: {}", execution_error(&e)),
            )),
        }
    }
    out
}

/// Evaluates `expression` with `vars` bound and requires a bool (admission webhooks'
/// `matchConditions`); the error says why it could not (compilation, evaluation, type).
pub(crate) fn evaluate_bool(expression: &str, vars: &[(&str, &Value)]) -> Result<bool, String> {
    let program = compile(expression)?;
    let mut ctx = cel::Context::default();
    for (name, v) in vars {
        let cv = cel::to_value(v).map_err(|e| e.to_string())?;
        ctx.add_variable(*name, cv).map_err(|e| e.to_string())?;
    }
    match program.execute(&ctx) {
        Ok(cel::Value::Bool(b)) => Ok(b),
        Ok(other) => Err(format!("expected a bool, got a {}", other.type_of())),
        Err(e) => Err(execution_error(&e)),
    }
}

/// What an evaluation error says, by the types of the values involved and never their
/// contents: the library's own text prints values with `Debug`, which is not meant for users
/// and lists a map's entries in no fixed order, so one rule could fail with differing messages.
fn execution_error(e: &cel::ExecutionError) -> String {
    use cel::ExecutionError as E;
    match e {
        E::UnsupportedTargetType { target } => {
            format!("invalid argument type: {}", target.type_of())
        }
        E::NotSupportedAsMethod { method, target } => {
            format!("no such overload: {}.{method}()", target.type_of())
        }
        E::UnsupportedKeyType(key) => format!("unsupported key type: {}", key.type_of()),
        E::ValuesNotComparable(a, b) => format!(
            "no such overload: {} and {} cannot be compared",
            a.type_of(),
            b.type_of()
        ),
        E::UnsupportedBinaryOperator(op, a, b) => {
            format!("no such overload: {} {op} {}", a.type_of(), b.type_of())
        }
        E::UnsupportedIndex(index, target) => format!(
            "no such overload: {} cannot be indexed by {}",
            target.type_of(),
            index.type_of()
        ),
        E::DivisionByZero(_) => "division by zero".to_owned(),
        E::RemainderByZero(_) => "modulus by zero".to_owned(),
        E::Overflow(op, a, b) => format!("{} {op} {} overflows", a.type_of(), b.type_of()),
        E::IndexOutOfBounds(_) => "index out of bounds".to_owned(),
        E::DuplicateKey(key) => format!("repeated key of type {} in a map literal", key.type_of()),
        // The rest name no values.
        other => other.to_string(),
    }
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
        assert!(causes[0]
            .message
            .contains("minReplicas must not exceed maxReplicas"));
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
            first[0]
                .message
                .ends_with("failed: no such overload: int mul map"),
            "{}",
            first[0].message
        );
        let s = json!({"type": "object", "x-kubernetes-validations": [{"rule": "{'a': 1}"}]});
        let causes = check(&s, &json!({}), None, "spec");
        assert!(
            causes[0]
                .message
                .ends_with("did not evaluate to a bool: it evaluated to a map"),
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
        let s = json!({"x-kubernetes-validations": [{"rule": "self.x =="}, {"rule": "size(self) > 0"}]});
        let errors = compile_errors(&s, "spec.versions[0].schema.openAPIV3Schema");
        assert_eq!(errors.len(), 1);
        assert!(errors[0]
            .field
            .ends_with("x-kubernetes-validations[0].rule"));
    }
}
