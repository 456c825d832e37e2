//! CRD conversion webhooks (`spec.conversion.strategy: Webhook`).
//!
//! Objects of a custom resource are stored in the CRD's storage version (each keeps the
//! `apiVersion` it was written in, so objects written before the storage version changed
//! keep theirs). A read in another version, or a write in a non-storage version, sends the
//! objects that are not yet in the wanted version to the webhook in one `ConversionReview`
//! (`apiextensions.k8s.io/v1`, or `v1beta1` when `conversionReviewVersions` names only
//! that): a GET sends one object, a LIST page all of its objects that need it, a watch each
//! event's object. The answer is checked as upstream's `webhookConverter` checks it, with
//! its messages (`conversion webhook for <group>/<version>, Kind=<kind> failed: …`), and
//! every converted object gets its original metadata back except labels and annotations.
//!
//! The HTTPS call is the one every webhook kind makes ([`crate::webhook::client`]).

use std::time::Duration;

use serde_json::{json, Map, Value};
use setpoint_api::status::ApiError;
use setpoint_api::Cause;

use crate::registry::ResourceDef;
use crate::state::ApiServer;

/// How long one conversion call may take: upstream's webhook clients give up after 30 s.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The `ConversionReview` versions this server sends, in the order it prefers them.
const REVIEW_VERSIONS: &[&str] = &["v1", "v1beta1"];

/// A CRD's conversion webhook: where it is and which `ConversionReview` versions it takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookConversion {
    /// `spec.conversion.webhook.clientConfig` (`url` or `service`, and `caBundle`).
    pub client_config: Value,
    /// `spec.conversion.webhook.conversionReviewVersions`.
    pub review_versions: Vec<String>,
}

/// The conversion webhook a CRD's spec names, when its strategy is `Webhook`.
pub fn webhook_of(spec: &Value) -> Option<WebhookConversion> {
    let conversion = spec.get("conversion")?;
    if conversion.get("strategy").and_then(Value::as_str) != Some("Webhook") {
        return None;
    }
    let webhook = conversion.get("webhook")?;
    Some(WebhookConversion {
        client_config: webhook.get("clientConfig").cloned().unwrap_or(Value::Null),
        review_versions: webhook
            .get("conversionReviewVersions")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default(),
    })
}

fn is_dns1035_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.starts_with(|c: char| c.is_ascii_lowercase())
        && !s.ends_with('-')
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Upstream's rules for `spec.conversion`, with its field paths (the internal type's
/// `webhookClientConfig`, as kube-apiserver reports them) and messages.
pub fn validate(spec: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let Some(conversion) = spec.get("conversion").filter(|c| !c.is_null()) else {
        return causes;
    };
    let strategy = conversion
        .get("strategy")
        .and_then(Value::as_str)
        .unwrap_or("");
    let webhook = conversion.get("webhook").filter(|w| !w.is_null());
    let client_config = webhook
        .and_then(|w| w.get("clientConfig"))
        .filter(|c| !c.is_null());
    let review_versions: Vec<&Value> = webhook
        .and_then(|w| w.get("conversionReviewVersions"))
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    match strategy {
        "None" => {
            if client_config.is_some() {
                causes.push(Cause::forbidden(
                    "spec.conversion.webhookClientConfig",
                    "should not be set when strategy is not set to Webhook",
                ));
            }
            if !review_versions.is_empty() {
                causes.push(Cause::forbidden(
                    "spec.conversion.conversionReviewVersions",
                    "should not be set when strategy is not set to Webhook",
                ));
            }
        }
        "Webhook" => {
            match client_config {
                None => causes.push(Cause::required(
                    "spec.conversion.webhookClientConfig",
                    "required when strategy is set to Webhook",
                )),
                Some(cc) => {
                    let url = cc.get("url").filter(|u| !u.is_null());
                    let service = cc.get("service").filter(|s| !s.is_null());
                    if url.is_some() == service.is_some() {
                        causes.push(Cause::required(
                            "spec.conversion.webhookClientConfig",
                            "exactly one of url or service is required",
                        ));
                    } else if let Some(u) = url.and_then(Value::as_str) {
                        if !u.starts_with("https://") {
                            causes.push(Cause::invalid(
                                "spec.conversion.webhookClientConfig.url",
                                &json!(u),
                                "'https' is the only allowed URL scheme",
                            ));
                        }
                    } else if let Some(s) = service {
                        for key in ["name", "namespace"] {
                            if s.get(key).and_then(Value::as_str).unwrap_or("").is_empty() {
                                causes.push(Cause::required(
                                    format!("spec.conversion.webhookClientConfig.service.{key}"),
                                    &format!("service {key} is required"),
                                ));
                            }
                        }
                    }
                }
            }
            causes.extend(validate_review_versions(&review_versions));
            if spec.get("preserveUnknownFields") == Some(&json!(true)) {
                causes.push(Cause::invalid(
                    "spec.conversion.strategy",
                    &json!(strategy),
                    "must be None if spec.preserveUnknownFields is true",
                ));
            }
        }
        other => causes.push(Cause::not_supported(
            "spec.conversion.strategy",
            &json!(other),
            &["None", "Webhook"],
        )),
    }
    causes
}

/// `conversionReviewVersions`: at least one, no duplicates, DNS-1035 labels, one this server
/// speaks.
fn validate_review_versions(versions: &[&Value]) -> Vec<Cause> {
    const FIELD: &str = "spec.conversion.conversionReviewVersions";
    let mut causes = Vec::new();
    if versions.is_empty() {
        causes.push(Cause::required(FIELD, ""));
        return causes;
    }
    let mut seen = Vec::new();
    let mut known = false;
    for (i, v) in versions.iter().enumerate() {
        let s = v.as_str().unwrap_or("");
        if seen.contains(&s) {
            causes.push(Cause::invalid(
                format!("{FIELD}[{i}]"),
                v,
                "duplicate version",
            ));
            continue;
        }
        seen.push(s);
        if !is_dns1035_label(s) {
            causes.push(Cause::invalid(
                format!("{FIELD}[{i}]"),
                v,
                "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')",
            ));
        }
        known |= REVIEW_VERSIONS.contains(&s);
    }
    if !known {
        causes.push(Cause::invalid(
            FIELD,
            &json!(versions),
            &format!(
                "must include at least one of {}",
                REVIEW_VERSIONS.join(", ")
            ),
        ));
    }
    causes
}

/// An object's group, version and kind as Go prints a `GroupVersionKind`
/// (`stable.example.com/v1, Kind=CronTab`).
fn gvk_text(obj: &Value) -> String {
    let (api_version, kind) = setpoint_api::meta::type_meta(obj);
    let api_version = if api_version.contains('/') {
        api_version.to_string()
    } else {
        format!("/{api_version}")
    };
    format!("{api_version}, Kind={kind}")
}

fn api_version_of(obj: &Value) -> &str {
    obj.get("apiVersion").and_then(Value::as_str).unwrap_or("")
}

/// The `ConversionReview` (of the first version `accepted` names that this server speaks)
/// asking for `objects` in `desired`.
pub fn review_request(
    accepted: &[String],
    uid: &str,
    desired: &str,
    objects: &[&Value],
) -> Result<(Value, &'static str), String> {
    let version = accepted
        .iter()
        .find_map(|v| REVIEW_VERSIONS.iter().find(|k| **k == v.as_str()))
        .ok_or_else(|| "no supported conversion review versions".to_string())?;
    Ok((
        json!({
            "apiVersion": format!("apiextensions.k8s.io/{version}"),
            "kind": "ConversionReview",
            "request": {"uid": uid, "desiredAPIVersion": desired, "objects": objects},
        }),
        version,
    ))
}

/// The converted objects of a `ConversionReview` answer, or why it is not one: what follows
/// `conversion webhook for <gvk> failed: `.
fn response_objects(answer: &Value, version: &str, uid: &str) -> Result<Vec<Value>, String> {
    if version == "v1" {
        let (got_version, got_kind) = setpoint_api::meta::type_meta(answer);
        if got_version != "apiextensions.k8s.io/v1" || got_kind != "ConversionReview" {
            return Err(format!(
                "expected webhook response of apiextensions.k8s.io/v1, Kind=ConversionReview, got {}",
                gvk_text(answer)
            ));
        }
    }
    let Some(response) = answer.get("response").filter(|r| r.is_object()) else {
        return Err("no response provided".into());
    };
    let got_uid = response.get("uid").and_then(Value::as_str).unwrap_or("");
    if version == "v1" && got_uid != uid {
        return Err(format!("expected response.uid={uid:?}, got {got_uid:?}"));
    }
    let status = response
        .pointer("/result/status")
        .and_then(Value::as_str)
        .unwrap_or("");
    if status != "Success" {
        return match response.pointer("/result/message").and_then(Value::as_str) {
            Some(m) if !m.is_empty() => Err(m.to_string()),
            _ => Err(format!(
                "response.result.status was '{status}', not 'Success'"
            )),
        };
    }
    Ok(response
        .get("convertedObjects")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default())
}

/// Upstream's `validateConvertedObject`: what a conversion must not change.
fn check_identity(original: &Value, converted: &Value) -> Result<(), String> {
    use setpoint_api::meta;
    let kind = |o: &Value| {
        o.get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    for (what, a, b) in [
        ("kind", kind(original), kind(converted)),
        (
            "name",
            meta::name(original).into(),
            meta::name(converted).into(),
        ),
        (
            "namespace",
            meta::namespace(original).into(),
            meta::namespace(converted).into(),
        ),
        (
            "UID",
            meta::uid(original).into(),
            meta::uid(converted).into(),
        ),
    ] {
        if a != b {
            return Err(format!("must have the same {what}: {a} != {b}"));
        }
    }
    Ok(())
}

/// Upstream's `restoreObjectMeta`: the original's metadata, with the converted object's
/// labels and annotations (whose values must be strings).
fn restore_metadata(original: &Value, converted: &mut Value) -> Result<(), String> {
    let response_meta = match converted.get("metadata") {
        None => return Err("missing metadata in converted object".into()),
        Some(Value::Object(m)) => m.clone(),
        Some(other) => {
            return Err(format!(
                "invalid metadata of type {} in converted object",
                go_type(other)
            ))
        }
    };
    let mut restored: Map<String, Value> = original
        .get("metadata")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    for field in ["labels", "annotations"] {
        match response_meta.get(field) {
            None | Some(Value::Null) => {
                restored.remove(field);
            }
            Some(Value::Object(m)) => {
                if let Some((k, v)) = m.iter().find(|(_, v)| !v.is_string()) {
                    return Err(format!(
                        "metadata.{field}[{k}] must be a string, but is {} in converted object",
                        go_type(v)
                    ));
                }
                restored.insert(field.into(), Value::Object(m.clone()));
            }
            Some(other) => {
                return Err(format!(
                    "invalid metadata.{field} of type {} in converted object",
                    go_type(other)
                ))
            }
        }
    }
    converted["metadata"] = Value::Object(restored);
    Ok(())
}

/// The Go type a JSON value decodes to, as upstream's `%T` prints it.
fn go_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "<nil>",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_i64() || n.is_u64() => "int64",
        Value::Number(_) => "float64",
        Value::String(_) => "string",
        Value::Array(_) => "[]interface {}",
        Value::Object(_) => "map[string]interface {}",
    }
}

/// Checks the converted objects of an answer against the `originals` sent, in order, and
/// restores their metadata. `single` uses upstream's wording for a one-object conversion.
pub fn apply_answer(
    answer: &Value,
    version: &str,
    uid: &str,
    desired: &str,
    originals: &[&Value],
    single: bool,
) -> Result<Vec<Value>, String> {
    let gvk = gvk_text(originals.first().copied().unwrap_or(&Value::Null));
    let objects = response_objects(answer, version, uid)
        .map_err(|e| format!("conversion webhook for {gvk} failed: {e}"))?;
    if objects.len() != originals.len() {
        return Err(format!(
            "conversion webhook for {gvk} returned {} objects, expected {}",
            objects.len(),
            originals.len()
        ));
    }
    let mut out = Vec::with_capacity(objects.len());
    for (i, (mut converted, original)) in objects.into_iter().zip(originals).enumerate() {
        let (at, invalid_meta) = if single {
            ("invalid object".to_string(), "invalid metadata".to_string())
        } else {
            (
                format!("invalid converted object at index {i}"),
                format!("invalid metadata in object at index {i}"),
            )
        };
        if !converted.is_object() {
            return Err(format!(
                "conversion webhook for {gvk} returned {at}: Object 'Kind' is missing in '{converted}'"
            ));
        }
        if api_version_of(&converted) != desired {
            return Err(format!(
                "conversion webhook for {gvk} returned {at}: invalid groupVersion (expected {desired}, received {})",
                api_version_of(&converted)
            ));
        }
        check_identity(original, &converted)
            .map_err(|e| format!("conversion webhook for {gvk} returned {at}: {e}"))?;
        restore_metadata(original, &mut converted)
            .map_err(|e| format!("conversion webhook for {gvk} returned {invalid_meta}: {e}"))?;
        out.push(converted);
    }
    Ok(out)
}

/// A failed call as upstream's REST client words it (admission's `failed to call webhook`
/// prefix is admission's own).
fn rest_error(e: &crate::webhook::client::CallError) -> String {
    use crate::webhook::client::CallError;
    match e {
        CallError::Config(m) | CallError::InvalidResponse(m) => m.clone(),
        CallError::Transport { url, reason } => format!("Post {url:?}: {reason}"),
        CallError::Status { body } => {
            format!("an error on the server ({body:?}) has prevented the request from succeeding")
        }
    }
}

impl ApiServer {
    /// `objects` in `desired` (`<group>/<version>`): those already in it as they are, the
    /// others converted by `res`'s conversion webhook in one review. A failure is upstream's
    /// 500 without a reason, which kubectl prints as `Error from server: conversion webhook
    /// for …`.
    #[tracing::instrument(skip_all, fields(crd = %res.custom.as_ref().map_or("", |c| c.crd_name.as_str()), desired, count = objects.len()))]
    pub(crate) async fn convert_by_webhook(
        &self,
        res: &ResourceDef,
        webhook: &WebhookConversion,
        mut objects: Vec<Value>,
        desired: &str,
    ) -> Result<Vec<Value>, ApiError> {
        let single = objects.len() == 1;
        let positions: Vec<usize> = (0..objects.len())
            .filter(|i| api_version_of(&objects[*i]) != desired)
            .collect();
        if positions.is_empty() {
            return Ok(objects);
        }
        let failed = |message: String| ApiError::new(500, "", message);
        let originals: Vec<&Value> = positions.iter().map(|i| &objects[*i]).collect();
        let uid = uuid::Uuid::new_v4().to_string();
        let (review, version) =
            review_request(&webhook.review_versions, &uid, desired, &originals).map_err(failed)?;
        let gvk = gvk_text(originals[0]);
        let body = serde_json::to_vec(&review).map_err(|e| failed(e.to_string()))?;
        let answer = self
            .call_webhook(&webhook.client_config, body.into(), TIMEOUT)
            .await
            .map_err(|e| {
                failed(format!(
                    "conversion webhook for {gvk} failed: {}",
                    rest_error(&e)
                ))
            })?;
        let answer: Value = serde_json::from_slice(&answer).map_err(|e| {
            failed(format!(
                "conversion webhook for {gvk} failed: invalid character in the response: {e}"
            ))
        })?;
        let converted =
            apply_answer(&answer, version, &uid, desired, &originals, single).map_err(|e| {
                tracing::warn!(error = %e, "conversion webhook failed");
                failed(e)
            })?;
        for (i, object) in positions.into_iter().zip(converted) {
            objects[i] = object;
        }
        Ok(objects)
    }

    /// Stored objects of `res`'s resource as `res`'s version shows them (converted by the
    /// CRD's webhook when it has one), with that version's defaults.
    pub(crate) async fn custom_from_storage(
        &self,
        res: &ResourceDef,
        objects: Vec<Value>,
    ) -> Result<Vec<Value>, ApiError> {
        let objects = match res.custom.as_ref().and_then(|c| c.webhook.as_ref()) {
            Some(w) => {
                self.convert_by_webhook(res, w, objects, &res.api_version())
                    .await?
            }
            None => objects,
        };
        Ok(objects
            .into_iter()
            .map(|o| crate::convert::from_storage(res, o))
            .collect())
    }

    /// A custom object written through `res` in the storage version (converted by the CRD's
    /// webhook when it has one).
    pub(crate) async fn custom_to_storage(
        &self,
        res: &ResourceDef,
        object: Value,
    ) -> Result<Value, ApiError> {
        let Some(custom) = &res.custom else {
            return Ok(crate::convert::to_storage(res, object));
        };
        let Some(w) = &custom.webhook else {
            return Ok(crate::convert::to_storage(res, object));
        };
        let storage = setpoint_api::resource::api_version(&res.group, &custom.storage_version);
        let mut object = object;
        if api_version_of(&object).is_empty() {
            // The server owns the type: a body without one is in the request's version.
            object["apiVersion"] = json!(res.api_version());
        }
        let converted = self
            .convert_by_webhook(res, w, vec![object], &storage)
            .await?;
        Ok(converted.into_iter().next().unwrap_or(Value::Null))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(conversion: Value) -> Value {
        json!({"group": "stable.example.com", "conversion": conversion})
    }

    fn messages(causes: &[Cause]) -> Vec<String> {
        causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect()
    }

    #[test]
    fn webhook_strategy_needs_a_client_config_and_review_versions() {
        assert_eq!(
            messages(&validate(&spec(json!({"strategy": "Webhook"})))),
            vec![
                "spec.conversion.webhookClientConfig: Required value: required when strategy is set to Webhook",
                "spec.conversion.conversionReviewVersions: Required value",
            ]
        );
        let m = messages(&validate(&spec(json!({"strategy": "Webhook", "webhook": {
            "clientConfig": {"url": "https://h/convert"},
            "conversionReviewVersions": ["v2", "v2"]}}))));
        assert_eq!(
            m,
            vec![
                "spec.conversion.conversionReviewVersions[1]: Invalid value: \"v2\": duplicate version",
                "spec.conversion.conversionReviewVersions: Invalid value: [\"v2\",\"v2\"]: must include at least one of v1, v1beta1",
            ]
        );
        let fine = validate(&spec(json!({"strategy": "Webhook", "webhook": {
            "clientConfig": {"service": {"name": "s", "namespace": "n"}},
            "conversionReviewVersions": ["v1"]}})));
        assert!(fine.is_empty(), "{fine:?}");
        let none = messages(&validate(&spec(json!({"strategy": "None", "webhook": {
            "clientConfig": {"url": "https://h"}, "conversionReviewVersions": ["v1"]}}))));
        assert_eq!(none.len(), 2);
        assert!(none[0].ends_with("should not be set when strategy is not set to Webhook"));
        let other = messages(&validate(&spec(json!({"strategy": "Magic"}))));
        assert_eq!(
            other,
            vec!["spec.conversion.strategy: Unsupported value: \"Magic\": supported values: \"None\", \"Webhook\""]
        );
    }

    fn stored() -> Value {
        json!({"apiVersion": "stable.example.com/v1", "kind": "CronTab",
               "metadata": {"name": "a", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                            "labels": {"x": "1"}},
               "spec": {"cronSpec": "* * * * *"}})
    }

    fn answer(uid: &str, objects: Value) -> Value {
        json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
               "response": {"uid": uid, "result": {"status": "Success"}, "convertedObjects": objects}})
    }

    #[test]
    fn an_answer_gives_converted_objects_with_the_original_metadata() {
        let original = stored();
        let (review, version) =
            review_request(&["v1".into()], "id", "stable.example.com/v2", &[&original]).unwrap();
        assert_eq!(
            review["request"]["desiredAPIVersion"],
            "stable.example.com/v2"
        );
        assert_eq!(version, "v1");
        let converted = json!({"apiVersion": "stable.example.com/v2", "kind": "CronTab",
            "metadata": {"name": "a", "namespace": "ns", "uid": "u1", "labels": {"y": "2"},
                         "resourceVersion": "changed"},
            "spec": {"schedule": "* * * * *"}});
        let out = apply_answer(
            &answer("id", json!([converted])),
            version,
            "id",
            "stable.example.com/v2",
            &[&original],
            true,
        )
        .unwrap();
        assert_eq!(out[0]["spec"]["schedule"], "* * * * *");
        assert_eq!(out[0]["metadata"]["resourceVersion"], "7");
        assert_eq!(out[0]["metadata"]["labels"], json!({"y": "2"}));
    }

    #[test]
    fn bad_answers_read_as_upstreams() {
        let original = stored();
        let run = |a: Value| {
            apply_answer(
                &a,
                "v1",
                "id",
                "stable.example.com/v2",
                &[&original, &original],
                false,
            )
            .unwrap_err()
        };
        assert_eq!(
            run(answer("other", json!([]))),
            "conversion webhook for stable.example.com/v1, Kind=CronTab failed: expected response.uid=\"id\", got \"other\""
        );
        let mut failed = answer("id", json!([]));
        failed["response"]["result"] = json!({"status": "Failure", "message": "no v2 for you"});
        assert_eq!(
            run(failed),
            "conversion webhook for stable.example.com/v1, Kind=CronTab failed: no v2 for you"
        );
        assert_eq!(
            run(answer("id", json!([stored()]))),
            "conversion webhook for stable.example.com/v1, Kind=CronTab returned 1 objects, expected 2"
        );
        let mut renamed = stored();
        renamed["apiVersion"] = json!("stable.example.com/v2");
        renamed["metadata"]["name"] = json!("b");
        assert_eq!(
            run(answer("id", json!([renamed.clone(), renamed]))),
            "conversion webhook for stable.example.com/v1, Kind=CronTab returned invalid converted object at index 0: must have the same name: a != b"
        );
        assert_eq!(
            run(answer("id", json!([stored(), stored()]))),
            "conversion webhook for stable.example.com/v1, Kind=CronTab returned invalid converted object at index 0: invalid groupVersion (expected stable.example.com/v2, received stable.example.com/v1)"
        );
    }
}
