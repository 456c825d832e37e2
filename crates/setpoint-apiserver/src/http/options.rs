//! The options of writes (`CreateOptions`, `UpdateOptions`, `PatchOptions`: dry run, field
//! manager, field validation) and deletes (`DeleteOptions` from the body or the query).

use http::HeaderMap;
use serde_json::Value;
use setpoint_api::ApiError;

use crate::objects::{DeleteOptions, FieldValidation, WriteOptions};
use crate::request::{field_manager_causes, go_quote, int_param, opt_bool_param, Query};

/// The options of a write from the query, validated as upstream validates them (`kind` is
/// `CreateOptions`, `UpdateOptions` or `PatchOptions`): a bad `fieldManager`, `dryRun` or
/// `fieldValidation` is a 422 Invalid on `<kind>.meta.k8s.io` with a cause each.
pub(super) fn write_options(q: &Query, kind: &str) -> Result<WriteOptions, ApiError> {
    let manager = q.get("fieldManager").cloned();
    let mut causes = field_manager_causes(manager.as_deref().unwrap_or(""));
    let dry_run = match dry_run_param(q) {
        Ok(d) => d,
        Err(c) => {
            causes.push(c);
            false
        }
    };
    let field_validation = match q.get("fieldValidation").map(String::as_str) {
        None | Some("") | Some("Warn") => FieldValidation::Warn,
        Some("Strict") => FieldValidation::Strict,
        Some("Ignore") => FieldValidation::Ignore,
        Some(other) => {
            causes.push(setpoint_api::Cause::new(
                "FieldValueNotSupported",
                "fieldValidation",
                format!(
                    "Unsupported value: {}: supported values: \"\", \"Ignore\", \"Strict\", \"Warn\"",
                    go_quote(other)
                ),
            ));
            FieldValidation::Warn
        }
    };
    if !causes.is_empty() {
        return Err(ApiError::invalid("meta.k8s.io", kind, "", causes));
    }
    Ok(WriteOptions {
        dry_run,
        field_validation,
        field_manager: manager,
        user: None,
        requested: None,
    })
}

/// The `dryRun` parameter: absent is false, `All` is true; anything else is upstream's
/// `dryRun: Unsupported value: []string{"x"}: supported values: "All"`.
pub(super) fn dry_run_param(q: &Query) -> Result<bool, setpoint_api::Cause> {
    match q.get("dryRun").map(String::as_str) {
        None => Ok(false),
        Some("All") => Ok(true),
        Some(other) => Err(setpoint_api::Cause::new(
            "FieldValueNotSupported",
            "dryRun",
            format!(
                "Unsupported value: []string{{{}}}: supported values: \"All\"",
                go_quote(other)
            ),
        )),
    }
}

/// Fills in the field manager of a write that names none from the User-Agent's product name
/// (`kubectl/v1.32.4 (linux/amd64) …` → `kubectl`), as Kubernetes does.
pub(super) fn with_default_manager(mut opts: WriteOptions, headers: &HeaderMap) -> WriteOptions {
    if opts.field_manager.as_deref().is_none_or(str::is_empty) {
        opts.field_manager = headers
            .get(http::header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .and_then(|ua| ua.split('/').next())
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .map(|m| m.chars().take(128).collect());
    }
    opts
}

/// The `DeleteOptions` a decoded body (or an Eviction's `deleteOptions`) gives.
pub(super) fn delete_options_from(v: &Value) -> DeleteOptions {
    let text = |p: &str| v.pointer(p).and_then(Value::as_str).map(String::from);
    let mut propagation_policy = text("/propagationPolicy");
    if v.get("orphanDependents").and_then(Value::as_bool) == Some(true)
        && propagation_policy.is_none()
    {
        propagation_policy = Some("Orphan".into());
    }
    DeleteOptions {
        grace_period_seconds: v.get("gracePeriodSeconds").and_then(Value::as_i64),
        propagation_policy,
        precondition_uid: text("/preconditions/uid"),
        precondition_resource_version: text("/preconditions/resourceVersion"),
        dry_run: v
            .get("dryRun")
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|x| x == "All")),
        user: None,
        requested: None,
    }
}

/// `DeleteOptions` from a JSON body (kubectl) or the query (Python client).
pub(super) fn delete_options(q: &Query, body: &[u8]) -> Result<DeleteOptions, ApiError> {
    let mut o = DeleteOptions::default();
    if !body.iter().all(u8::is_ascii_whitespace) {
        let v: Value = if body.starts_with(b"k8s\0") {
            setpoint_protobuf::decode(body)
                .map_err(|e| ApiError::bad_request(format!("decoding DeleteOptions: {e}")))?
        } else {
            serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("decoding DeleteOptions: {e}")))?
        };
        o = delete_options_from(&v);
    }
    if let Some(g) = int_param(q, "gracePeriodSeconds")? {
        o.grace_period_seconds = Some(g);
    }
    let mut causes = Vec::new();
    if let Some(p) = q.get("propagationPolicy") {
        if !matches!(p.as_str(), "Foreground" | "Background" | "Orphan") {
            causes.push(setpoint_api::Cause::new(
                "FieldValueNotSupported",
                "propagationPolicy",
                format!(
                    "Unsupported value: {}: supported values: \"Foreground\", \"Background\", \"Orphan\", \"nil\"",
                    go_quote(p)
                ),
            ));
        }
        o.propagation_policy = Some(p.clone());
    }
    match opt_bool_param(q, "orphanDependents") {
        Some(_) if q.contains_key("propagationPolicy") => {
            let p = q.get("propagationPolicy").map_or("", String::as_str);
            causes.insert(
                0,
                setpoint_api::Cause::new(
                    "FieldValueInvalid",
                    "propagationPolicy",
                    format!(
                        "Invalid value: {}: orphanDependents and deletionPropagation cannot be both set",
                        go_quote(p)
                    ),
                ),
            );
        }
        Some(true) if o.propagation_policy.is_none() => {
            o.propagation_policy = Some("Orphan".into());
        }
        _ => {}
    }
    match dry_run_param(q) {
        Ok(true) => o.dry_run = true,
        Ok(false) => {}
        Err(c) => causes.push(c),
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid(
            "meta.k8s.io",
            "DeleteOptions",
            "",
            causes,
        ));
    }
    Ok(o)
}
