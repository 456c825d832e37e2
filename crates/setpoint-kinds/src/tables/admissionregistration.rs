//! Printers for `admissionregistration.k8s.io`: webhook configurations show how many
//! webhooks they register.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::{age, arr_at, col, name_cell, Column, AGE, NAME};

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
