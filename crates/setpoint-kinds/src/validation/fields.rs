//! Shared field helpers: tolerant JSON access (a value of the wrong type reads as absent; the
//! typed decode reports it), field-path building, comparison ignoring `null` members, and the
//! rules many kinds share (non-negative numbers, qualified names, DNS names, label selectors,
//! enumerations).

use serde_json::{json, Value};
use setpoint_api::names;
use setpoint_api::Cause;
use std::collections::BTreeSet;

use super::meta::labels;

// ---- JSON access (tolerant: wrong types read as absent; the typed decode reports them) ----

static NULL: Value = Value::Null;

/// A child value (`null` when absent or when `v` is not an object).
pub(super) fn at<'a>(v: &'a Value, key: &str) -> &'a Value {
    v.get(key).unwrap_or(&NULL)
}

/// A string child, `""` when absent or not a string.
pub(super) fn s<'a>(v: &'a Value, key: &str) -> &'a str {
    at(v, key).as_str().unwrap_or("")
}

/// An array child, empty when absent or not an array.
pub(super) fn arr<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    at(v, key).as_array().map(Vec::as_slice).unwrap_or(&[])
}

/// A map child's entries, empty when absent or not an object.
pub(super) fn entries(v: &Value) -> impl Iterator<Item = (&String, &Value)> {
    v.as_object().into_iter().flatten()
}

pub(super) fn int(v: &Value, key: &str) -> Option<i64> {
    at(v, key).as_i64()
}

pub(super) fn present(v: &Value, key: &str) -> bool {
    !at(v, key).is_null()
}

pub(super) fn child(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

pub(super) fn index(path: &str, i: usize) -> String {
    format!("{path}[{i}]")
}

pub(super) fn key(path: &str, k: &str) -> String {
    format!("{path}[{k}]")
}

/// A copy without `null` members, so that "absent" and "null" compare equal.
pub(super) fn strip_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, x)| !x.is_null())
                .map(|(k, x)| (k.clone(), strip_nulls(x)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_nulls).collect()),
        other => other.clone(),
    }
}

/// Whether `a` and `b` are equal once `null` members are dropped ([`strip_nulls`]), without
/// copying either.
pub(super) fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            x.iter()
                .filter(|(_, v)| !v.is_null())
                .all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
                && y.iter()
                    .filter(|(_, w)| !w.is_null())
                    .all(|(k, _)| x.get(k).is_some_and(|v| !v.is_null()))
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(v, w)| same(v, w))
        }
        _ => a == b,
    }
}

/// Paths where two values differ (at most `limit`), for messages about forbidden changes.
pub(super) fn diff_paths(a: &Value, b: &Value, path: &str, out: &mut Vec<String>, limit: usize) {
    if out.len() >= limit {
        return;
    }
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                diff_paths(
                    x.get(k).unwrap_or(&NULL),
                    y.get(k).unwrap_or(&NULL),
                    &child(path, k),
                    out,
                    limit,
                );
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                diff_paths(p, q, &index(path, i), out, limit);
            }
        }
        _ if a != b => out.push(path.to_string()),
        _ => {}
    }
}

// ---- shared field rules ----

pub(super) fn non_negative(e: &mut Vec<Cause>, v: &Value, field: &str, path: &str) {
    if let Some(n) = int(v, field) {
        if n < 0 {
            e.push(Cause::invalid(
                path,
                &json!(n),
                "must be greater than or equal to 0",
            ));
        }
    }
}

pub(super) fn qualified_name(e: &mut Vec<Cause>, name: &str, path: &str) {
    for msg in names::is_qualified_name(name).err().unwrap_or_default() {
        e.push(Cause::invalid(path, &json!(name), &msg));
    }
}

pub(super) fn dns_label(e: &mut Vec<Cause>, name: &str, path: &str) {
    for msg in names::is_dns1123_label(name).err().unwrap_or_default() {
        e.push(Cause::invalid(path, &json!(name), &msg));
    }
}

pub(super) fn dns_subdomain(e: &mut Vec<Cause>, name: &str, path: &str) {
    for msg in names::is_dns1123_subdomain(name).err().unwrap_or_default() {
        e.push(Cause::invalid(path, &json!(name), &msg));
    }
}

/// `ValidateLabelSelector` on a `metav1.LabelSelector`.
pub(super) fn label_selector(e: &mut Vec<Cause>, sel: &Value, path: &str) {
    labels(e, at(sel, "matchLabels"), &child(path, "matchLabels"));
    for (i, expr) in arr(sel, "matchExpressions").iter().enumerate() {
        let p = index(&child(path, "matchExpressions"), i);
        let values = arr(expr, "values");
        match s(expr, "operator") {
            "In" | "NotIn" => {
                if values.is_empty() {
                    e.push(Cause::required(
                        child(&p, "values"),
                        "must be specified when `operator` is 'In' or 'NotIn'",
                    ));
                }
            }
            "Exists" | "DoesNotExist" => {
                if !values.is_empty() {
                    e.push(Cause::forbidden(
                        child(&p, "values"),
                        "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                    ));
                }
            }
            other => e.push(Cause::invalid(
                child(&p, "operator"),
                &json!(other),
                "not a valid selector operator",
            )),
        }
        qualified_name(e, s(expr, "key"), &child(&p, "key"));
        for (j, v) in values.iter().enumerate() {
            let v = v.as_str().unwrap_or("");
            for msg in names::is_valid_label_value(v).err().unwrap_or_default() {
                e.push(Cause::invalid(
                    index(&child(&p, "values"), j),
                    &json!(v),
                    &msg,
                ));
            }
        }
    }
}

pub(super) fn is_empty_selector(sel: &Value) -> bool {
    entries(at(sel, "matchLabels")).next().is_none() && arr(sel, "matchExpressions").is_empty()
}

pub(super) fn not_supported(
    e: &mut Vec<Cause>,
    path: impl Into<String>,
    value: &str,
    supported: &[&str],
) {
    e.push(Cause::not_supported(path, &json!(value), supported));
}

/// A required enum field: `Required value` when empty, `Unsupported value` when unknown.
pub(super) fn enum_field(e: &mut Vec<Cause>, value: &str, path: &str, supported: &[&str]) {
    if value.is_empty() {
        e.push(Cause::required(path, ""));
    } else if !supported.contains(&value) {
        not_supported(e, path, value, supported);
    }
}

/// An optional enum field: checked only when set.
pub(super) fn optional_enum(
    e: &mut Vec<Cause>,
    v: &Value,
    field: &str,
    path: &str,
    supported: &[&str],
) {
    if let Some(value) = at(v, field).as_str() {
        if !supported.contains(&value) {
            not_supported(e, path, value, supported);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::testutil::small_json;

    proptest::proptest! {
        /// Comparing in place agrees with comparing copies stripped of `null` members.
        #[test]
        fn same_agrees_with_comparing_stripped_copies(a in small_json(), b in small_json()) {
            proptest::prop_assert_eq!(same(&a, &b), strip_nulls(&a) == strip_nulls(&b));
            proptest::prop_assert!(same(&a, &strip_nulls(&a)));
        }
    }
}
