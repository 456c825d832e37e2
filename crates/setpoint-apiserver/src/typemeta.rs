//! The server owns an object's type: `apiVersion` and `kind` of what is stored come from the
//! resource being written, never from a client's body.
//!
//! A stored object whose `kind` says something else breaks every typed client of the resource
//! (an informer that cannot decode a list relists forever), so every write path goes through
//! here: request bodies are checked against the resource ([`check_body`]), patch results are
//! checked the way upstream's decode of the patched JSON checks them ([`check_patched`]), and
//! whatever is about to be stored gets the resource's type written over it ([`own`]).

use serde_json::{json, Map, Value};
use setpoint_api::{ApiError, Cause};

use crate::patch::Patch;
use crate::registry::ResourceDef;

/// The name upstream's scheme of built-in types goes by in its "not registered" errors.
const SCHEME: &str = "pkg/api/legacyscheme/scheme.go:30";

/// Checks `apiVersion`/`kind` of a create, update or apply body against the resource, filling
/// them in when absent or empty: 400 when one is not a string or names another type.
pub fn check_body(res: &ResourceDef, obj: &mut Value) -> Result<(), ApiError> {
    let want_av = res.api_version();
    let map = obj
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("the request body must be a JSON object"))?;
    if let Some(field) = non_string_field(map) {
        return Err(ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type {}): couldn't get version/kind; json parse error: {} ({})",
            res.kind,
            go_type_error("", field, &map[field], "string"),
            summarize(&Value::Object(map.clone())),
        )));
    }
    match map.get("apiVersion").and_then(Value::as_str) {
        None | Some("") => {
            map.insert("apiVersion".into(), json!(want_av));
        }
        Some(av) if av != want_av => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({want_av})"
            )))
        }
        _ => {}
    }
    match map.get("kind").and_then(Value::as_str) {
        None | Some("") => {
            map.insert("kind".into(), json!(res.kind));
        }
        Some(k) if k != res.kind => {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                res.kind
            )))
        }
        _ => {}
    }
    Ok(())
}

/// Checks the result of applying `patch` to an object of `res` (the main resource), as
/// upstream's decode of the patched document does:
/// - a JSON merge patch or JSON patch that leaves `apiVersion`/`kind` naming another type, or
///   of another JSON type, or `metadata` not an object, is refused with 422 (`patch: Invalid
///   value`) for built-in kinds; a custom resource gets 422 on `apiVersion`/`kind` ("must be");
/// - a strategic merge patch decodes into the kind's own type, so a different `apiVersion` or
///   `kind` string is dropped; other JSON types are refused like the above.
///
/// Missing type fields are filled in (upstream defaults them from the type decoded into); a
/// custom resource without them is refused, since its decoder needs them.
pub fn check_patched(res: &ResourceDef, patch: &Patch, obj: &mut Value) -> Result<(), ApiError> {
    let want_av = res.api_version();
    let Some(map) = obj.as_object_mut() else {
        return Err(ApiError::bad_request(
            "the patched object is not a JSON object",
        ));
    };
    if res.custom.is_some() {
        return check_patched_custom(res, map);
    }
    let type_error = non_string_field(map)
        .map(|f| {
            format!(
                "couldn't get version/kind; json parse error: {}",
                go_type_error("", f, &map[f], "string")
            )
        })
        .or_else(|| {
            map.get("metadata")
                .filter(|m| !m.is_object() && !m.is_null())
                .map(|m| go_type_error(&res.kind, "metadata", m, "v1.ObjectMeta"))
        });
    if let Some(reason) = type_error {
        return Err(patch_invalid(map, &reason));
    }
    let strategic = matches!(patch, Patch::Strategic(..));
    let av = map.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = map.get("kind").and_then(Value::as_str).unwrap_or("");
    let av = if av.is_empty() { want_av.as_str() } else { av };
    let kind = if kind.is_empty() {
        res.kind.as_str()
    } else {
        kind
    };
    if !strategic && (av != want_av || kind != res.kind) {
        let reason =
            format!("no kind {kind:?} is registered for version {av:?} in scheme {SCHEME:?}");
        return Err(patch_invalid(map, &reason));
    }
    own_map(res, map);
    Ok(())
}

/// Custom resources decode as unstructured objects: both type fields must be strings, and
/// validation then says what they must be.
fn check_patched_custom(res: &ResourceDef, map: &mut Map<String, Value>) -> Result<(), ApiError> {
    let want_av = res.api_version();
    let mut causes = Vec::new();
    for (field, want) in [
        ("apiVersion", want_av.as_str()),
        ("kind", res.kind.as_str()),
    ] {
        match map.get(field) {
            Some(Value::String(s)) if s == want => {}
            Some(Value::String(s)) if !s.is_empty() => {
                causes.push(Cause::invalid(field, &json!(s), &format!("must be {want}")))
            }
            Some(Value::String(_)) | None | Some(Value::Null) => {
                let reason = format!(
                    "Object '{}' is missing in '{}'",
                    if field == "kind" {
                        "Kind"
                    } else {
                        "apiVersion"
                    },
                    Value::Object(map.clone())
                );
                return Err(patch_invalid(map, &reason));
            }
            Some(other) => {
                return Err(patch_invalid(
                    map,
                    &go_type_error("", field, other, "string"),
                ))
            }
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        let name = map
            .get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str)
            .unwrap_or("");
        Err(ApiError::invalid(&res.group, &res.kind, name, causes))
    }
}

/// Writes the resource's `apiVersion` and `kind` over whatever `obj` says: the last step
/// before an object is stored, so that nothing else (an object written by an older version,
/// a subresource view) can leave another type in the store.
pub fn own(res: &ResourceDef, obj: &mut Value) {
    if let Some(map) = obj.as_object_mut() {
        own_map(res, map);
    }
}

fn own_map(res: &ResourceDef, map: &mut Map<String, Value>) {
    let av = res.api_version();
    if map.get("apiVersion").and_then(Value::as_str) != Some(av.as_str()) {
        map.insert("apiVersion".into(), json!(av));
    }
    if map.get("kind").and_then(Value::as_str) != Some(res.kind.as_str()) {
        map.insert("kind".into(), json!(res.kind));
    }
}

/// The first of `apiVersion` and `kind` that is present with a JSON type other than a string
/// (`null` counts as absent, as in Go's decoding).
fn non_string_field(map: &Map<String, Value>) -> Option<&'static str> {
    ["apiVersion", "kind"]
        .into_iter()
        .find(|f| map.get(*f).is_some_and(|v| !v.is_string() && !v.is_null()))
}

/// Go's `encoding/json` type error: `json: cannot unmarshal number into Go struct field
/// Deployment.metadata of type v1.ObjectMeta`.
fn go_type_error(go_struct: &str, field: &str, value: &Value, go_type: &str) -> String {
    let found = match value {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    format!(
        "json: cannot unmarshal {found} into Go struct field {go_struct}.{field} of type {go_type}"
    )
}

/// Upstream's answer when a patched document does not decode: 422 on the field `patch`, with
/// the patched JSON as the value, for no kind and no name.
fn patch_invalid(map: &Map<String, Value>, reason: &str) -> ApiError {
    let patched = Value::Object(map.clone()).to_string();
    ApiError::invalid(
        "",
        "",
        "",
        vec![Cause::invalid("patch", &Value::String(patched), reason)],
    )
}

/// The start of a body, as upstream shows it in decode errors: its first 30 bytes.
fn summarize(obj: &Value) -> String {
    let s = obj.to_string();
    if s.len() > 30 {
        let mut end = 30;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{} ...", &s[..end])
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;

    fn deployments() -> ResourceDef {
        Registry::builtin()
            .get("apps", "v1", "deployments")
            .map(|r| (**r).clone())
            .expect("deployments")
    }

    fn merge(p: Value) -> Patch {
        Patch::Merge(p)
    }

    #[test]
    fn bodies_get_the_type_filled_in_or_refused() {
        let res = deployments();
        let mut obj = json!({"metadata": {"name": "a"}, "kind": null});
        check_body(&res, &mut obj).unwrap();
        assert_eq!(obj["apiVersion"], "apps/v1");
        assert_eq!(obj["kind"], "Deployment");

        let e = check_body(&res, &mut json!({"kind": "Pod"})).unwrap_err();
        assert_eq!(e.code, 400);
        assert_eq!(
            e.message,
            "the kind in the data (Pod) does not match the expected kind (Deployment)"
        );
        let e = check_body(&res, &mut json!({"apiVersion": "v1"})).unwrap_err();
        assert_eq!(
            e.message,
            "the API version in the data (v1) does not match the expected API version (apps/v1)"
        );
        let e = check_body(&res, &mut json!({"kind": 5})).unwrap_err();
        assert_eq!(e.code, 400);
        assert_eq!(
            e.message,
            "the object provided is unrecognized (must be of type Deployment): couldn't get version/kind; json parse error: json: cannot unmarshal number into Go struct field .kind of type string ({\"kind\":5})"
        );
    }

    #[test]
    fn merge_and_json_patch_results_naming_another_type_are_invalid() {
        let res = deployments();
        for (bad, reason) in [
            (
                json!({"apiVersion": "apps/v1", "kind": "Pod"}),
                "no kind \"Pod\" is registered for version \"apps/v1\" in scheme \"pkg/api/legacyscheme/scheme.go:30\"",
            ),
            (
                json!({"apiVersion": "v1", "kind": "Deployment"}),
                "no kind \"Deployment\" is registered for version \"v1\" in scheme \"pkg/api/legacyscheme/scheme.go:30\"",
            ),
            (
                json!({"apiVersion": "apps/v1", "kind": 5}),
                "couldn't get version/kind; json parse error: json: cannot unmarshal number into Go struct field .kind of type string",
            ),
            (
                json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": "x"}),
                "json: cannot unmarshal string into Go struct field Deployment.metadata of type v1.ObjectMeta",
            ),
        ] {
            let mut obj = bad.clone();
            let e = check_patched(&res, &merge(json!({})), &mut obj).unwrap_err();
            assert_eq!(e.code, 422, "{bad}");
            assert_eq!(e.reason, "Invalid");
            let causes = &e.details.as_ref().unwrap().causes;
            assert_eq!(causes[0].field, "patch");
            assert!(e.message.starts_with(" \"\" is invalid: patch: Invalid value: \"{"), "{}", e.message);
            assert!(e.message.ends_with(&format!(": {reason}")), "{}", e.message);
        }
    }

    #[test]
    fn patches_that_remove_the_type_get_it_back() {
        let res = deployments();
        let mut obj = json!({"metadata": {"name": "a"}});
        check_patched(&res, &Patch::Json(vec![]), &mut obj).unwrap();
        assert_eq!(obj["kind"], "Deployment");
        assert_eq!(obj["apiVersion"], "apps/v1");
    }

    #[test]
    fn strategic_patches_decode_into_the_kind_and_drop_another_type() {
        let res = deployments();
        let ty = crate::patch::strategic_type(&res, crate::strategy::View::Main).unwrap();
        let mut obj = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a"}});
        check_patched(&res, &Patch::Strategic(json!({}), ty), &mut obj).unwrap();
        assert_eq!(obj["kind"], "Deployment");
        assert_eq!(obj["apiVersion"], "apps/v1");
        let mut obj = json!({"kind": [1]});
        let e = check_patched(&res, &Patch::Strategic(json!({}), ty), &mut obj).unwrap_err();
        assert_eq!(e.code, 422);
    }

    #[test]
    fn own_overwrites_whatever_is_there() {
        let res = deployments();
        let mut obj = json!({"apiVersion": null, "kind": "Pod"});
        own(&res, &mut obj);
        assert_eq!(obj, json!({"apiVersion": "apps/v1", "kind": "Deployment"}));
    }
}
