//! Admission webhook configurations (`admissionregistration.k8s.io/v1`): upstream's
//! `validateValidatingWebhook`/`validateMutatingWebhook` with the v1 rules (`sideEffects`
//! and `admissionReviewVersions` required), and `ValidateWebhookClientConfig`.

pub(super) mod policy;

use std::collections::HashSet;

use serde_json::{json, Value};
use setpoint_api::Cause;

use super::fields::{arr, at, child, index, int, label_selector, optional_enum, s};

/// The `AdmissionReview` versions this server speaks, as upstream lists them.
const REVIEW_VERSIONS: &[&str] = &["v1", "v1beta1"];
/// The `sideEffects` classes v1 accepts.
const NO_SIDE_EFFECTS: &[&str] = &["None", "NoneOnDryRun"];
const OPERATIONS: &[&str] = &["*", "CONNECT", "CREATE", "DELETE", "UPDATE"];

pub(super) fn webhook_configuration(e: &mut Vec<Cause>, obj: &Value, mutating: bool) {
    let mut names = HashSet::new();
    for (i, hook) in arr(obj, "webhooks").iter().enumerate() {
        let p = index("webhooks", i);
        let name = s(hook, "name");
        webhook_name(e, name, &child(&p, "name"));
        if !name.is_empty() && !names.insert(name) {
            e.push(Cause::duplicate(child(&p, "name"), &json!(name)));
        }
        let versions = arr(hook, "admissionReviewVersions");
        let versions_path = child(&p, "admissionReviewVersions");
        if versions.is_empty() {
            e.push(Cause::required(
                versions_path,
                &format!("must specify one of {}", REVIEW_VERSIONS.join(", ")),
            ));
        } else if !versions
            .iter()
            .any(|v| REVIEW_VERSIONS.contains(&v.as_str().unwrap_or("")))
        {
            e.push(Cause::invalid(
                versions_path,
                at(hook, "admissionReviewVersions"),
                &format!(
                    "must include at least one of {}",
                    REVIEW_VERSIONS.join(", ")
                ),
            ));
        }
        for (j, rule) in arr(hook, "rules").iter().enumerate() {
            rule_with_operations(e, rule, &index(&child(&p, "rules"), j));
        }
        optional_enum(
            e,
            hook,
            "failurePolicy",
            &child(&p, "failurePolicy"),
            &["Fail", "Ignore"],
        );
        optional_enum(
            e,
            hook,
            "matchPolicy",
            &child(&p, "matchPolicy"),
            &["Equivalent", "Exact"],
        );
        match at(hook, "sideEffects").as_str() {
            None | Some("") => e.push(Cause::required(
                child(&p, "sideEffects"),
                &format!("must specify one of {}", NO_SIDE_EFFECTS.join(", ")),
            )),
            Some(v) if !NO_SIDE_EFFECTS.contains(&v) => e.push(Cause::not_supported(
                child(&p, "sideEffects"),
                &json!(v),
                NO_SIDE_EFFECTS,
            )),
            Some(_) => {}
        }
        if let Some(t) = int(hook, "timeoutSeconds") {
            if !(1..=30).contains(&t) {
                e.push(Cause::invalid(
                    child(&p, "timeoutSeconds"),
                    &json!(t),
                    "the timeout value must be between 1 and 30 seconds",
                ));
            }
        }
        if mutating {
            optional_enum(
                e,
                hook,
                "reinvocationPolicy",
                &child(&p, "reinvocationPolicy"),
                &["IfNeeded", "Never"],
            );
        }
        for key in ["namespaceSelector", "objectSelector"] {
            let sel = at(hook, key);
            if !sel.is_null() {
                label_selector(e, sel, &child(&p, key));
            }
        }
        client_config(e, at(hook, "clientConfig"), &child(&p, "clientConfig"));
        let mut conditions = HashSet::new();
        for (j, c) in arr(hook, "matchConditions").iter().enumerate() {
            let cp = index(&child(&p, "matchConditions"), j);
            let cname = s(c, "name");
            if cname.is_empty() {
                e.push(Cause::required(child(&cp, "name"), ""));
            } else if !conditions.insert(cname) {
                e.push(Cause::duplicate(child(&cp, "name"), &json!(cname)));
            }
            if s(c, "expression").is_empty() {
                e.push(Cause::required(child(&cp, "expression"), ""));
            }
        }
    }
}

/// `IsFullyQualifiedName`: a DNS subdomain of at least three segments.
fn webhook_name(e: &mut Vec<Cause>, name: &str, path: &str) {
    if name.is_empty() {
        e.push(Cause::required(path, ""));
        return;
    }
    for msg in setpoint_api::names::is_dns1123_subdomain(name)
        .err()
        .unwrap_or_default()
    {
        e.push(Cause::invalid(path, &json!(name), &msg));
    }
    if name.split('.').count() < 3 {
        e.push(Cause::invalid(
            path,
            &json!(name),
            "should be a domain with at least three segments separated by dots",
        ));
    }
}

pub(super) fn rule_with_operations(e: &mut Vec<Cause>, rule: &Value, path: &str) {
    let ops = arr(rule, "operations");
    if ops.is_empty() {
        e.push(Cause::required(child(path, "operations"), ""));
    }
    for (k, op) in ops.iter().enumerate() {
        let op = op.as_str().unwrap_or("");
        if !OPERATIONS.contains(&op) {
            e.push(Cause::not_supported(
                index(&child(path, "operations"), k),
                &json!(op),
                OPERATIONS,
            ));
        }
    }
    if ops.len() > 1 && ops.iter().any(|o| o == "*") {
        e.push(Cause::invalid(
            child(path, "operations"),
            at(rule, "operations"),
            "if '*' is present, must not specify other operations",
        ));
    }
    for (field, what) in [
        ("apiGroups", "API groups"),
        ("apiVersions", "API versions"),
        ("resources", "resources"),
    ] {
        let items = arr(rule, field);
        if items.is_empty() {
            e.push(Cause::required(child(path, field), ""));
        }
        if items.len() > 1 && items.iter().any(|v| v == "*") {
            e.push(Cause::invalid(
                child(path, field),
                at(rule, field),
                &format!("if '*' is present, must not specify other {what}"),
            ));
        }
    }
    optional_enum(
        e,
        rule,
        "scope",
        &child(path, "scope"),
        &["*", "Cluster", "Namespaced"],
    );
}

/// `ValidateWebhookClientConfig`: exactly one of `url` (https, a host, no query or
/// fragment) and `service` (name, namespace, a path starting with `/`, a valid port).
fn client_config(e: &mut Vec<Cause>, cc: &Value, path: &str) {
    let url = at(cc, "url").as_str();
    let service = at(cc, "service");
    match (url, service.is_null()) {
        (Some(url), true) => {
            let up = child(path, "url");
            match url.split_once("://") {
                Some((scheme, rest)) => {
                    if scheme != "https" {
                        e.push(Cause::invalid(
                            &up,
                            &json!(url),
                            "'https' is the only allowed URL scheme",
                        ));
                    }
                    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
                    if host.is_empty() {
                        e.push(Cause::invalid(&up, &json!(url), "host must be specified"));
                    }
                    if rest.contains('#') {
                        e.push(Cause::invalid(
                            &up,
                            &json!(url),
                            "fragments are not permitted",
                        ));
                    }
                    if rest.contains('?') {
                        e.push(Cause::invalid(
                            &up,
                            &json!(url),
                            "query parameters are not permitted",
                        ));
                    }
                }
                None => e.push(Cause::invalid(
                    &up,
                    &json!(url),
                    "'https' is the only allowed URL scheme",
                )),
            }
        }
        (None, false) => {
            let sp = child(path, "service");
            for field in ["name", "namespace"] {
                if s(service, field).is_empty() {
                    e.push(Cause::required(
                        child(&sp, field),
                        &format!("service {field} is required"),
                    ));
                }
            }
            let p = s(service, "path");
            if !p.is_empty() && !p.starts_with('/') {
                e.push(Cause::invalid(
                    child(&sp, "path"),
                    &json!(p),
                    "must start with a '/'",
                ));
            }
            if let Some(port) = int(service, "port") {
                if !(1..=65535).contains(&port) {
                    e.push(Cause::invalid(
                        child(&sp, "port"),
                        &json!(port),
                        "port is not valid: must be between 1 and 65535, inclusive",
                    ));
                }
            }
        }
        _ => e.push(Cause::required(
            path,
            "exactly one of url or service is required",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook() -> Value {
        json!({"name": "deny.example.com", "admissionReviewVersions": ["v1"],
               "sideEffects": "None", "clientConfig": {"url": "https://127.0.0.1:9443/v"},
               "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                          "resources": ["configmaps"]}]})
    }

    fn errors(hooks: Vec<Value>) -> Vec<String> {
        let mut e = vec![];
        webhook_configuration(&mut e, &json!({ "webhooks": hooks }), true);
        e.iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect()
    }

    #[test]
    fn a_complete_webhook_is_valid() {
        assert_eq!(errors(vec![hook()]), Vec::<String>::new());
    }

    #[test]
    fn v1_requires_side_effects_and_review_versions() {
        let mut h = hook();
        h.as_object_mut().unwrap().remove("sideEffects");
        h["admissionReviewVersions"] = json!([]);
        let e = errors(vec![h]);
        assert!(e.iter().any(|m| m.contains("webhooks[0].sideEffects")
            && m.contains("must specify one of None, NoneOnDryRun")));
        assert!(e
            .iter()
            .any(|m| m.contains("webhooks[0].admissionReviewVersions")
                && m.contains("must specify one of v1, v1beta1")));
    }

    #[test]
    fn names_are_qualified_and_unique_and_urls_are_https() {
        let mut bad = hook();
        bad["name"] = json!("deny");
        bad["clientConfig"] = json!({"url": "http://x/y"});
        let e = errors(vec![hook(), hook(), bad]);
        assert!(e
            .iter()
            .any(|m| m.contains("webhooks[1].name") && m.contains("Duplicate")));
        assert!(e.iter().any(|m| m.contains("at least three segments")));
        assert!(e
            .iter()
            .any(|m| m.contains("'https' is the only allowed URL scheme")));
    }
}
