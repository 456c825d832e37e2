//! `matchConditions`: CEL expressions over `object`, `oldObject` and `request`, evaluated
//! in the API server's CEL environment ([`crate::cel`]), with Kubernetes' libraries. Each
//! webhook's conditions share one budget of upstream's per-call limit. The `authorizer`
//! variable is not available yet: an expression naming it fails to evaluate, which
//! `failurePolicy` then decides.

use serde_json::Value;

/// What a webhook's conditions decided.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Every condition is true (or there are none): the webhook is called.
    Call,
    /// A condition is false: the webhook is skipped.
    Skip,
    /// No condition is false but one could not be evaluated.
    Error(String),
}

/// Evaluates `conditions` in order; a false one wins over errors, as upstream's matcher.
pub(crate) fn evaluate(
    conditions: &[Value],
    object: &Value,
    old: &Value,
    request: &Value,
) -> Outcome {
    let mut error = None;
    let mut budget = crate::cel::Budget::new(crate::cel::PER_CALL_LIMIT);
    for c in conditions {
        let name = c.get("name").and_then(Value::as_str).unwrap_or("");
        let expr = c.get("expression").and_then(Value::as_str).unwrap_or("");
        match crate::cel::evaluate_bool(
            expr,
            &[("object", object), ("oldObject", old), ("request", request)],
            &mut budget,
        ) {
            Ok(true) => {}
            Ok(false) => return Outcome::Skip,
            Err(e) => {
                error.get_or_insert(format!("expression '{name}' resulted in error: {e}"));
            }
        }
    }
    match error {
        Some(e) => Outcome::Error(e),
        None => Outcome::Call,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cond(name: &str, expr: &str) -> Value {
        json!({"name": name, "expression": expr})
    }

    #[test]
    fn conditions_decide_on_object_and_request() {
        let obj = json!({"metadata": {"name": "a", "labels": {"skip": "yes"}}});
        let req = json!({"operation": "CREATE"});
        let skip_labelled = cond(
            "not-skipped",
            "!has(object.metadata.labels) || !('skip' in object.metadata.labels)",
        );
        assert_eq!(
            evaluate(
                std::slice::from_ref(&skip_labelled),
                &obj,
                &Value::Null,
                &req
            ),
            Outcome::Skip
        );
        let plain = json!({"metadata": {"name": "b"}});
        assert_eq!(
            evaluate(&[skip_labelled], &plain, &Value::Null, &req),
            Outcome::Call
        );
        let creates = cond("creates", "request.operation == 'CREATE'");
        assert_eq!(
            evaluate(&[creates], &plain, &Value::Null, &req),
            Outcome::Call
        );
    }

    #[test]
    fn a_false_condition_wins_over_an_error() {
        let obj = json!({"metadata": {"name": "a"}});
        let broken = cond("broken", "object.nope.deeper == 1");
        let no = cond("no", "false");
        assert_eq!(
            evaluate(&[broken.clone(), no], &obj, &Value::Null, &json!({})),
            Outcome::Skip
        );
        assert!(
            matches!(evaluate(&[broken], &obj, &Value::Null, &json!({})), Outcome::Error(e) if e.starts_with("expression 'broken' resulted in error: "))
        );
        let not_bool = cond("int", "1");
        assert!(matches!(
            evaluate(&[not_bool], &obj, &Value::Null, &json!({})),
            Outcome::Error(_)
        ));
    }
}
