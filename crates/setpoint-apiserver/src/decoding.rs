//! Decode errors of built-in kinds in Kubernetes' words.
//!
//! Kubernetes decodes a request body into the kind's Go type before anything else, so a value
//! of the wrong JSON type (a number for `metadata.name`) is a 400 from its JSON decoder, not a
//! validation error: `Pod in version "v1" cannot be handled as a Pod: json: cannot unmarshal
//! number into Go struct field ObjectMeta.metadata.name of type string`. The type checks in
//! `setpoint_kinds::validation` find the field and the value; this module names them as Go's
//! decoder does, from the type graph (`setpoint_protobuf::types`): the struct that holds the
//! field, the field's path from the top (array indices left out), the Go type it has.

use serde_json::Value;
use setpoint_api::{ApiError, Cause};
use setpoint_protobuf::types::{self, FieldRef, Form, TypeRef};

use crate::registry::ResourceDef;

/// The 400 Kubernetes answers for a body it cannot decode as `res`'s kind: `{Kind} in version
/// "{version}" cannot be handled as a {Kind}: {detail}`.
pub fn cannot_be_handled(res: &ResourceDef, detail: &str) -> ApiError {
    ApiError::bad_request(format!(
        "{} in version \"{}\" cannot be handled as a {}: {detail}",
        res.kind, res.version, res.kind
    ))
}

/// A JSON syntax error in the words of Go's decoder, which Kubernetes passes on: `invalid
/// character 'x' looking for beginning of value`, `unexpected end of JSON input`. serde_json
/// says where the error is; the character there and what the parser expected name it. Errors
/// Go words differently in ways not worth guessing keep serde_json's text, without its
/// position suffix.
pub fn json_syntax_error(body: &[u8], e: &serde_json::Error) -> String {
    use serde_json::error::Category;
    let text = e.to_string();
    let what = match text.rfind(" at line ") {
        Some(i) => &text[..i],
        None => text.as_str(),
    };
    match e.classify() {
        Category::Eof => return "unexpected end of JSON input".into(),
        Category::Syntax => {}
        Category::Io | Category::Data => return what.to_string(),
    }
    let context = if what == "expected value" || what == "trailing comma" {
        "looking for beginning of value"
    } else if what == "key must be a string" {
        "looking for beginning of object key string"
    } else if what == "expected `:`" {
        "after object key"
    } else if what == "expected `,` or `}`" {
        "after object key:value pair"
    } else if what == "expected `,` or `]`" {
        "after array element"
    } else if what == "trailing characters" {
        "after top-level value"
    } else if what == "invalid escape" {
        "in string escape code"
    } else if what.starts_with("control character") {
        "in string literal"
    } else if what == "expected ident" {
        "in literal"
    } else {
        return what.to_string();
    };
    match char_at(body, e.line(), e.column()) {
        Some(c) => format!("invalid character {} {context}", go_quote(c)),
        None => "unexpected end of JSON input".into(),
    }
}

/// The character at a 1-based line and column (serde_json's position of an error).
fn char_at(body: &[u8], line: usize, column: usize) -> Option<char> {
    let text = String::from_utf8_lossy(body);
    let line_text = text.split('\n').nth(line.checked_sub(1)?)?;
    line_text.chars().nth(column.saturating_sub(1))
}

/// A character quoted as Go's JSON decoder quotes it in its messages.
fn go_quote(c: char) -> String {
    match c {
        '\'' => r"'\''".to_string(),
        '"' => "'\"'".to_string(),
        c => format!("'{}'", c.escape_default()),
    }
}

/// The 400 for the first value of the wrong type in `obj`, a write of `res` (`type_errors` as
/// the kind's type check reports them, in document order), or `None` when there is none. The
/// message is Go's JSON decoder's when the type graph knows the field, else the check's own.
pub fn type_error(res: &ResourceDef, obj: &Value, type_errors: &[Cause]) -> Option<ApiError> {
    // Base64 byte fields are reported by the kind's own rules (a 422 naming `data[key]`).
    let first = type_errors
        .iter()
        .find(|c| !setpoint_kinds::validation::checked_by_rules(&res.group, &res.kind, c))?;
    let ty = types::for_kind(&res.group, &res.version, &res.kind);
    let value = lookup(obj, &split_path(&first.field));
    let detail = ty
        .and_then(|ty| go_unmarshal_error(ty, &first.field, value))
        .unwrap_or_else(|| format!("{}: {}", first.field, first.message));
    Some(cannot_be_handled(res, &detail))
}

/// The 400 for a custom resource whose `metadata` does not decode as an `ObjectMeta`, or `None`.
/// Kubernetes decodes a custom resource's metadata on its own (the rest is checked against the
/// CRD's schema), so its decoder names the field from `metadata` down:
/// `json: cannot unmarshal string into Go struct field ObjectMeta.labels of type
/// map[string]string`.
pub fn custom_metadata_error(res: &ResourceDef, obj: &Value) -> Option<ApiError> {
    res.custom.as_ref()?;
    let object_meta = TypeRef::by_name("k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta")?;
    let detail = match obj.get("metadata")? {
        Value::Null => return None,
        Value::Object(_) => {
            let (path, value) = first_mismatch(object_meta, obj.get("metadata")?, String::new())?;
            go_unmarshal_error(object_meta, &path, Some(value))?
        }
        other => format!(
            "json: cannot unmarshal {} into Go value of type v1.ObjectMeta",
            json_kind(other)
        ),
    };
    Some(cannot_be_handled(res, &detail))
}

/// How Go's decoder names the kind of a JSON value.
fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::String(_) => "string",
        Value::Bool(_) => "bool",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
        Value::Number(_) => "number",
        Value::Null => "null",
    }
}

/// The first value (in document order) of `v`, an object of type `ty`, whose JSON type does not
/// fit its field, with its path from `v`. Fields the type does not know are not looked at.
fn first_mismatch(ty: TypeRef, v: &Value, path: String) -> Option<(String, &Value)> {
    let Value::Object(map) = v else {
        return None;
    };
    for (key, value) in map {
        let Some(field) = ty.field(key) else {
            continue;
        };
        let at = if path.is_empty() {
            key.clone()
        } else {
            format!("{path}.{key}")
        };
        if value.is_null() {
            continue;
        }
        if field.is_list() {
            let Value::Array(items) = value else {
                return Some((at, value));
            };
            for (i, item) in items.iter().enumerate() {
                if let Some(found) = item_mismatch(field.form(), item, format!("{at}[{i}]")) {
                    return Some(found);
                }
            }
        } else if field.is_map() {
            let Value::Object(values) = value else {
                return Some((at, value));
            };
            for (k, item) in values {
                if let Some(found) = item_mismatch(field.form(), item, format!("{at}.{k}")) {
                    return Some(found);
                }
            }
        } else if let Some(found) = item_mismatch(field.form(), value, at) {
            return Some(found);
        }
    }
    None
}

/// [`first_mismatch`] for one value of a given form.
fn item_mismatch(form: Form, v: &Value, path: String) -> Option<(String, &Value)> {
    let fits = match (form, v) {
        (_, Value::Null) => true,
        (Form::Object(t), Value::Object(_)) => return first_mismatch(t, v, path),
        (Form::String | Form::Bytes | Form::Time | Form::MicroTime | Form::Duration, v) => {
            v.is_string()
        }
        (Form::Boolean, v) => v.is_boolean(),
        (Form::Int32 | Form::Int64, v) => v.is_i64() || v.is_u64(),
        (Form::Double, v) => v.is_number(),
        (Form::Quantity, v) => v.is_string() || v.is_number(),
        (Form::IntOrString, v) => v.is_string() || v.is_i64() || v.is_u64(),
        (Form::StringList, Value::Array(items)) => items.iter().all(Value::is_string),
        (Form::RawJson | Form::SchemaUnion, _) => true,
        _ => false,
    };
    (!fits).then_some((path, v))
}

/// The value at a path, if there is one.
fn lookup<'a>(obj: &'a Value, path: &[Segment<'_>]) -> Option<&'a Value> {
    path.iter().try_fold(obj, |cur, seg| match seg {
        Segment::Key(k) => cur.get(*k),
        Segment::Index(i) => cur.get(*i),
    })
}

/// What a decode target is, as far as the error message needs: the Go type's name, and whether
/// it is an integer (Go quotes the number it could not fit).
struct Target {
    go_type: String,
    integer: bool,
}

/// `json: cannot unmarshal <what> into Go struct field <Struct>.<path> of type <type>` for the
/// value at `path` (`spec.containers[0].image`) of an object of type `top`; `None` when the path
/// leaves the typed graph (a free-form part, or a path the graph does not know).
fn go_unmarshal_error(top: TypeRef, path: &str, value: Option<&Value>) -> Option<String> {
    let segments = split_path(path);
    let mut ty = top;
    let mut field: Option<FieldRef> = None;
    let mut names: Vec<&str> = Vec::new();
    // Whether the value is an item of the current field (a list element or a map value),
    // rather than the field's own value.
    let mut item = false;
    let mut i = 0;
    while i < segments.len() {
        match segments[i] {
            Segment::Index(_) => {
                if !field.is_some_and(FieldRef::is_list) || item {
                    return None;
                }
                item = true;
            }
            Segment::Key(key) => {
                if field.is_some_and(FieldRef::is_map) && !item {
                    // A map key: what follows is in the map's value.
                    item = true;
                    i += 1;
                    continue;
                }
                if let Some(f) = field {
                    // Into the field's (or its item's) struct.
                    ty = match f.form() {
                        Form::Object(t) if !f.is_list() && !f.is_map() || item => t,
                        _ => return None,
                    };
                }
                let f = ty.field(key)?;
                names.push(f.name());
                field = Some(f);
                item = false;
            }
        }
        i += 1;
    }
    let field = field?;
    let target = target_of(field, item);
    let what = match value {
        Some(Value::String(_)) => "string".to_string(),
        Some(Value::Bool(_)) => "bool".to_string(),
        Some(Value::Array(_)) => "array".to_string(),
        Some(Value::Object(_)) => "object".to_string(),
        // Go names a number it could not fit into an integer, and only the kind otherwise.
        Some(Value::Number(n)) if target.integer => format!("number {n}"),
        Some(Value::Number(_)) => "number".to_string(),
        Some(Value::Null) | None => return None,
    };
    Some(format!(
        "json: cannot unmarshal {what} into Go struct field {}.{} of type {}",
        field.owner().short_name(),
        names.join("."),
        target.go_type
    ))
}

/// The Go type a value of `field` decodes into: the field's own type, or (for `item`) that of
/// one list element or map value.
fn target_of(field: FieldRef, item: bool) -> Target {
    let elem = go_name(field.form(), field.type_name());
    let integer = matches!(field.form(), Form::Int32 | Form::Int64);
    if item || !(field.is_list() || field.is_map()) {
        return Target {
            go_type: elem,
            integer,
        };
    }
    let go_type = if field.is_map() {
        format!("map[string]{elem}")
    } else {
        format!("[]{elem}")
    };
    Target {
        go_type,
        integer: false,
    }
}

/// The Go name of a value's type: a scalar's, or `package.Type` for a message (the package is
/// the protobuf package's last part, as Go's `reflect.Type` prints it).
fn go_name(form: Form, message: Option<&str>) -> String {
    match form {
        Form::String => "string".into(),
        Form::Bytes => "[]uint8".into(),
        Form::Boolean => "bool".into(),
        Form::Int32 => "int32".into(),
        Form::Int64 => "int64".into(),
        Form::Double => "float64".into(),
        Form::StringList => "[]string".into(),
        _ => {
            let name = message.unwrap_or_default();
            let mut parts = name.rsplit('.');
            match (parts.next(), parts.next()) {
                (Some(short), Some(package)) => format!("{package}.{short}"),
                (Some(short), None) => short.to_string(),
                _ => "interface {}".into(),
            }
        }
    }
}

/// One step of a path as validation writes it: a property, or a list index.
#[derive(Debug, PartialEq)]
pub(crate) enum Segment<'a> {
    Key(&'a str),
    Index(usize),
}

/// Splits `a.b[0].c` into keys and indices (map keys with dots are not told apart here: such a
/// path simply leaves the typed graph and gets the check's own message).
pub(crate) fn split_path(path: &str) -> Vec<Segment<'_>> {
    let mut out = Vec::new();
    for part in path.split('.').filter(|p| !p.is_empty()) {
        let (key, mut rest) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        if !key.is_empty() {
            out.push(Segment::Key(key));
        }
        while let (Some(start), Some(end)) = (rest.find('['), rest.find(']')) {
            match rest.get(start + 1..end).and_then(|n| n.parse().ok()) {
                Some(n) => out.push(Segment::Index(n)),
                // Not an index: a path the typed graph cannot follow.
                None => out.push(Segment::Key(rest)),
            }
            rest = rest.get(end + 1..).unwrap_or("");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn message(group: &str, version: &str, kind: &str, path: &str, value: Value) -> String {
        let ty = types::for_kind(group, version, kind).unwrap();
        go_unmarshal_error(ty, path, Some(&value)).unwrap()
    }

    #[test]
    fn names_the_struct_the_path_and_the_go_type() {
        assert_eq!(
            message("", "v1", "Pod", "metadata.name", json!(5)),
            "json: cannot unmarshal number into Go struct field ObjectMeta.metadata.name of type string"
        );
        assert_eq!(
            message("apps", "v1", "Deployment", "spec.replicas", json!("3")),
            "json: cannot unmarshal string into Go struct field DeploymentSpec.spec.replicas of type int32"
        );
        assert_eq!(
            message("apps", "v1", "Deployment", "spec.replicas", json!(1.5)),
            "json: cannot unmarshal number 1.5 into Go struct field DeploymentSpec.spec.replicas of type int32"
        );
        assert_eq!(
            message(
                "apps",
                "v1",
                "Deployment",
                "spec.template.spec.containers[0].image",
                json!(["x"])
            ),
            "json: cannot unmarshal array into Go struct field Container.spec.template.spec.containers.image of type string"
        );
    }

    #[test]
    fn lists_maps_and_their_items() {
        assert_eq!(
            message("", "v1", "Pod", "spec.containers", json!("x")),
            "json: cannot unmarshal string into Go struct field PodSpec.spec.containers of type []v1.Container"
        );
        assert_eq!(
            message("", "v1", "Pod", "spec.containers[1]", json!(7)),
            "json: cannot unmarshal number into Go struct field PodSpec.spec.containers of type v1.Container"
        );
        assert_eq!(
            message("", "v1", "Pod", "metadata.labels", json!([])),
            "json: cannot unmarshal array into Go struct field ObjectMeta.metadata.labels of type map[string]string"
        );
        assert_eq!(
            message("", "v1", "Pod", "metadata.labels.app", json!(true)),
            "json: cannot unmarshal bool into Go struct field ObjectMeta.metadata.labels of type string"
        );
        assert_eq!(
            message("", "v1", "Pod", "metadata", json!("m")),
            "json: cannot unmarshal string into Go struct field Pod.metadata of type v1.ObjectMeta"
        );
    }

    fn syntax(body: &str) -> String {
        let e = serde_json::from_str::<Value>(body).unwrap_err();
        json_syntax_error(body.as_bytes(), &e)
    }

    #[test]
    fn syntax_errors_read_as_gos() {
        assert_eq!(
            syntax("x"),
            "invalid character 'x' looking for beginning of value"
        );
        assert_eq!(
            syntax("{bad}"),
            "invalid character 'b' looking for beginning of object key string"
        );
        assert_eq!(
            syntax(r#"{"a" 1}"#),
            "invalid character '1' after object key"
        );
        assert_eq!(
            syntax("{\"a\": 1\n \"b\": 2}"),
            "invalid character '\"' after object key:value pair"
        );
        assert_eq!(syntax("[1 2]"), "invalid character '2' after array element");
        assert_eq!(
            syntax("{} x"),
            "invalid character 'x' after top-level value"
        );
        assert_eq!(syntax(r#"{"a": "#), "unexpected end of JSON input");
        assert_eq!(syntax(""), "unexpected end of JSON input");
    }

    #[test]
    fn custom_resource_metadata_is_decoded_on_its_own() {
        let meta = TypeRef::by_name("k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta").unwrap();
        let m = json!({"name": "b", "labels": "app=x"});
        let (path, v) = first_mismatch(meta, &m, String::new()).unwrap();
        assert_eq!(
            go_unmarshal_error(meta, &path, Some(v)).unwrap(),
            "json: cannot unmarshal string into Go struct field ObjectMeta.labels of type map[string]string"
        );
        let m = json!({"annotations": {"ok": "v", "a": 1}});
        let (path, v) = first_mismatch(meta, &m, String::new()).unwrap();
        assert_eq!(
            go_unmarshal_error(meta, &path, Some(v)).unwrap(),
            "json: cannot unmarshal number into Go struct field ObjectMeta.annotations of type string"
        );
        let m = json!({"managedFields": "everything"});
        let (path, v) = first_mismatch(meta, &m, String::new()).unwrap();
        assert_eq!(
            go_unmarshal_error(meta, &path, Some(v)).unwrap(),
            "json: cannot unmarshal string into Go struct field ObjectMeta.managedFields of type []v1.ManagedFieldsEntry"
        );
        let fine = json!({"name": "b", "labels": {"a": "b"}, "ownerReferences": [{"name": "x"}],
                          "creationTimestamp": null, "generation": 3, "unknown": 1});
        assert!(first_mismatch(meta, &fine, String::new()).is_none());
    }

    #[test]
    fn paths_outside_the_graph_have_no_go_message() {
        let ty = types::for_kind("", "v1", "Pod").unwrap();
        assert!(go_unmarshal_error(ty, "spec.nope", Some(&json!(1))).is_none());
        assert!(go_unmarshal_error(ty, "metadata.name[0]", Some(&json!(1))).is_none());
        assert_eq!(
            split_path("a.b[0][1].c"),
            vec![
                Segment::Key("a"),
                Segment::Key("b"),
                Segment::Index(0),
                Segment::Index(1),
                Segment::Key("c")
            ]
        );
    }
}
