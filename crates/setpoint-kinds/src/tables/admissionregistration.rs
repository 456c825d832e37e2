//! Printers for `admissionregistration.k8s.io`: webhook configurations show how many
//! webhooks they register, admission policies their validations and parameter kind, and
//! bindings their policy and parameter.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::{age, arr_at, col, name_cell, str_at, Column, AGE, NAME};

/// MutatingWebhookConfiguration and ValidatingWebhookConfiguration.
pub(super) const WEBHOOKS: &[Column] = &[
    NAME,
    col(
        "Webhooks",
        "integer",
        "Webhooks indicates the number of webhooks registered in this configuration.",
    ),
    AGE,
];

pub(super) fn webhooks(c: &Value, now: DateTime<Utc>) -> Vec<Value> {
    vec![
        name_cell(c),
        Value::from(arr_at(c, "webhooks").len()),
        age(c, now),
    ]
}

/// ValidatingAdmissionPolicy.
pub(super) const POLICY: &[Column] = &[
    NAME,
    col(
        "Validations",
        "integer",
        "Validations indicates the number of validation rules defined in this configuration",
    ),
    col(
        "ParamKind",
        "string",
        "ParamKind specifies the kind of resources used to parameterize this policy",
    ),
    AGE,
];

pub(super) fn policy(p: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let kind = p.pointer("/spec/paramKind").filter(|k| !k.is_null());
    let param_kind = kind.map_or_else(
        || "<unset>".to_string(),
        |k| format!("{}/{}", str_at(k, "apiVersion"), str_at(k, "kind")),
    );
    vec![
        name_cell(p),
        Value::from(arr_at(p, "spec.validations").len()),
        Value::from(param_kind),
        age(p, now),
    ]
}

/// ValidatingAdmissionPolicyBinding.
pub(super) const BINDING: &[Column] = &[
    NAME,
    col(
        "PolicyName",
        "string",
        "PolicyName indicates the policy definition which the policy binding binded to",
    ),
    col(
        "ParamRef",
        "string",
        "ParamRef indicates the param resource which sets the configration param",
    ),
    AGE,
];

pub(super) fn binding(b: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let spec = b.get("spec").unwrap_or(&Value::Null);
    let param = match spec.get("paramRef").filter(|r| !r.is_null()) {
        None => "<unset>".to_string(),
        Some(r) if !str_at(r, "name").is_empty() => match str_at(r, "namespace") {
            // A name without a namespace may be cluster-scoped or in the request's namespace.
            "" => format!("*/{}", str_at(r, "name")),
            ns => format!("{ns}/{}", str_at(r, "name")),
        },
        Some(r) => r
            .get("selector")
            .filter(|s| !s.is_null())
            .and_then(|s| setpoint_api::selector::LabelSelector::from_label_selector_json(s).ok())
            .map_or_else(|| "<unset>".to_string(), |s| s.to_string()),
    };
    vec![
        name_cell(b),
        Value::from(str_at(spec, "policyName")),
        Value::from(param),
        age(b, now),
    ]
}
