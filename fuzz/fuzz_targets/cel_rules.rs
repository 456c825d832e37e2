//! CRD validation rules (`x-kubernetes-validations`): the CEL compiler and evaluator behind
//! `setpoint_apiserver::crd::cel`.
//!
//! Input: the rule on the first line; the rest, when it is JSON, is the value `self` is bound
//! to (else `{}`). Must hold: compiling never panics and gives the same answer every time
//! (the second answer comes from the compiled-rule cache); a rule that compiles evaluates the
//! same way twice, and the same with and without an old value unless it reads `oldSelf`;
//! every cause is at the rule's field; when the rule evaluates to a bool, its negation
//! `!(rule)` fails exactly when the rule passes, with the rule's message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};
use setpoint_apiserver::crd::cel;

const MESSAGE: &str = "fuzz rule failed";

fn schema(rule: &str) -> Value {
    json!({"type": "object", "x-kubernetes-validations": [{"rule": rule, "message": MESSAGE}]})
}

/// Whether `causes` is exactly the one cause of a rule that evaluated to false. Errors end
/// with the message too (`<error> evaluating rule: <message>`, as upstream words them), so
/// they are told apart by those words.
fn failed_as_false(causes: &[setpoint_api::Cause]) -> bool {
    causes.len() == 1
        && causes[0].message.ends_with(&format!(": {MESSAGE}"))
        && !causes[0].message.contains(" evaluating rule: ")
        && !causes[0].message.contains(" limit for rule: ")
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (rule, rest) = text.split_once('\n').unwrap_or((text, ""));
    let value = serde_json::from_str::<Value>(rest).unwrap_or_else(|_| json!({}));
    let s = schema(rule);
    let errors = cel::compile_errors(&s, "spec");
    assert!(errors.len() <= 1, "{errors:?}");
    for e in &errors {
        assert_eq!(e.field, "spec.x-kubernetes-validations[0].rule", "{e:?}");
    }
    assert_eq!(
        cel::compile_errors(&s, "spec"),
        errors,
        "compiling twice gives the same answer"
    );
    if !errors.is_empty() {
        return;
    }
    let causes = cel::check(&s, &value, None, "spec");
    assert_eq!(
        cel::check(&s, &value, None, "spec"),
        causes,
        "deterministic"
    );
    for c in &causes {
        assert_eq!(c.field, "spec", "{c:?}");
    }
    let reads_old = rule.contains("oldSelf");
    if !reads_old {
        assert_eq!(
            cel::check(&s, &value, Some(&value), "spec"),
            causes,
            "a rule that does not read oldSelf ignores it"
        );
    }
    let negated = schema(&format!("!({rule})"));
    if !cel::compile_errors(&negated, "spec").is_empty() {
        return;
    }
    let negated_causes = cel::check(&negated, &value, None, "spec");
    if causes.is_empty() && !reads_old {
        assert!(
            failed_as_false(&negated_causes),
            "{rule:?} passed, so !({rule}) fails with the message: {negated_causes:?}"
        );
    }
    if failed_as_false(&causes) {
        assert!(
            negated_causes.is_empty(),
            "{rule:?} was false, so !({rule}) passes: {negated_causes:?}"
        );
    }
});
