//! `matchConditions`: CEL expressions over `object`, `oldObject`, `request` and
//! `authorizer`, evaluated in the API server's CEL environment ([`crate::cel`]), with
//! Kubernetes' libraries. `authorizer` checks what the request's user may do and
//! `authorizer.requestResource` is the request's own resource, bound as admission policies
//! bind them ([`crate::cel::authz`]); each check costs upstream's 350000. Each webhook's
//! conditions share one budget of upstream's per-call limit.

use serde_json::Value;

use crate::cel::authz::Bindings;

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

/// Evaluates `conditions` in order, with `authorizer` for the `authorizer` variables; a
/// false one wins over errors, as upstream's matcher.
pub(crate) fn evaluate(
    conditions: &[Value],
    object: &Value,
    old: &Value,
    request: &Value,
    authorizer: &Bindings,
) -> Outcome {
    let mut error = None;
    let mut budget = crate::cel::Budget::new(crate::cel::PER_CALL_LIMIT);
    for c in conditions {
        let name = c.get("name").and_then(Value::as_str).unwrap_or("");
        let expr = c.get("expression").and_then(Value::as_str).unwrap_or("");
        match crate::cel::evaluate_bool(
            expr,
            &[("object", object), ("oldObject", old), ("request", request)],
            Some(authorizer),
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

    use std::sync::Arc;

    use crate::authentication::UserInfo;
    use crate::authorization::{Attributes, Authorizer, Authorizers, Decision};
    use crate::cel::authz::ResourceAttributes;

    fn cond(name: &str, expr: &str) -> Value {
        json!({"name": name, "expression": expr})
    }

    /// Allows `alice` to `approve` certificate signing requests, and nothing else.
    struct AliceApproves;

    impl Authorizer for AliceApproves {
        fn authorize(&self, a: &Attributes) -> Decision {
            let csr = a.resource_request
                && a.api_group == "certificates.k8s.io"
                && a.resource == "certificatesigningrequests"
                && a.name == "csr-1";
            if a.user.username == "alice" && a.verb == "approve" && csr {
                Decision::Allow
            } else {
                Decision::NoOpinion
            }
        }
    }

    /// The `authorizer` variables of a request by `user` to certificate signing request
    /// `csr-1`.
    fn as_user(user: &str) -> Bindings {
        let mut authorizers = Authorizers::default();
        authorizers.push(Box::new(AliceApproves));
        Bindings::new(
            Arc::new(authorizers),
            Arc::new(UserInfo::authenticated(user, vec![])),
            ResourceAttributes {
                group: "certificates.k8s.io".into(),
                resource: "certificatesigningrequests".into(),
                name: "csr-1".into(),
                ..Default::default()
            },
        )
    }

    fn run(conditions: &[Value], object: &Value, old: &Value, request: &Value) -> Outcome {
        evaluate(conditions, object, old, request, &as_user("bob"))
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
            run(
                std::slice::from_ref(&skip_labelled),
                &obj,
                &Value::Null,
                &req
            ),
            Outcome::Skip
        );
        let plain = json!({"metadata": {"name": "b"}});
        assert_eq!(
            run(&[skip_labelled], &plain, &Value::Null, &req),
            Outcome::Call
        );
        let creates = cond("creates", "request.operation == 'CREATE'");
        assert_eq!(run(&[creates], &plain, &Value::Null, &req), Outcome::Call);
    }

    #[test]
    fn a_false_condition_wins_over_an_error() {
        let obj = json!({"metadata": {"name": "a"}});
        let broken = cond("broken", "object.nope.deeper == 1");
        let no = cond("no", "false");
        assert_eq!(
            run(&[broken.clone(), no], &obj, &Value::Null, &json!({})),
            Outcome::Skip
        );
        assert!(
            matches!(run(&[broken], &obj, &Value::Null, &json!({})), Outcome::Error(e) if e.starts_with("expression 'broken' resulted in error: "))
        );
        let not_bool = cond("int", "1");
        assert!(matches!(
            run(&[not_bool], &obj, &Value::Null, &json!({})),
            Outcome::Error(_)
        ));
    }

    #[test]
    fn conditions_ask_the_authorizer_about_the_request_user() {
        let obj = json!({"metadata": {"name": "csr-1"}});
        let req = json!({"operation": "UPDATE"});
        // Users allowed to approve skip the webhook; others are sent to it.
        let unless_approver = cond(
            "not-approver",
            "!authorizer.requestResource.check('approve').allowed()",
        );
        let explicit = cond(
            "not-approver-explicit",
            "!authorizer.group('certificates.k8s.io').resource('certificatesigningrequests')\
             .name(object.metadata.name).check('approve').allowed()",
        );
        for c in [&unless_approver, &explicit] {
            let c = std::slice::from_ref(c);
            assert_eq!(
                evaluate(c, &obj, &Value::Null, &req, &as_user("alice")),
                Outcome::Skip
            );
            assert_eq!(
                evaluate(c, &obj, &Value::Null, &req, &as_user("bob")),
                Outcome::Call
            );
        }
        // Each check costs 350000 of the webhook's budget of 1000000: a third fails.
        let check = "authorizer.path('/healthz').check('get').errored()";
        let three: Vec<Value> = (0..3)
            .map(|i| cond(&format!("c{i}"), &format!("!{check}")))
            .collect();
        assert!(
            matches!(run(&three, &obj, &Value::Null, &req), Outcome::Error(e) if e.starts_with("expression 'c2' resulted in error: ")),
            "{:?}",
            run(&three, &obj, &Value::Null, &req)
        );
        assert_eq!(run(&three[..2], &obj, &Value::Null, &req), Outcome::Call);
    }
}
