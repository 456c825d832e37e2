//! Validation of built-in kinds (422 causes with Kubernetes' field paths and wording), type
//! checking against the k8s-openapi types, and unknown-field detection for `fieldValidation`.
//!
//! [`validate`] expects the object after defaulting ([`crate::defaults::apply`]) and, for Jobs,
//! after [`crate::defaults::job_selector`], the same order the Kubernetes API server uses. The
//! rules are the ones kubectl users meet most; each cites upstream's message text so that error
//! output reads the same.
//!
//! Type errors (a string where an integer belongs) are found by decoding into the k8s-openapi
//! type. serde_json stops at the first error and reports only a line, so the object is rendered
//! with one value per line, the line mapped back to a field path, the bad value removed and the
//! decode retried, which yields one cause per bad field.

use std::collections::{BTreeSet, HashSet};

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Map, Value};
use setpoint_api::names;
use setpoint_api::selector::LabelSelector;
use setpoint_api::Cause;

/// Validates an object of this kind on create (`old` = None) or update; empty means valid.
pub fn validate(
    group: &str,
    version: &str,
    kind: &str,
    obj: &Value,
    old: Option<&Value>,
) -> Vec<Cause> {
    validate_with_type_errors(
        group,
        kind,
        obj,
        old,
        type_errors(group, version, kind, obj),
    )
}

/// What one typed decode of an object finds: values of the wrong type, and unknown fields.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TypeCheck {
    pub type_errors: Vec<Cause>,
    /// Paths as [`unknown_fields`] reports them.
    pub unknown: Vec<String>,
    /// Where every field the type does not know is, `null` ones included (which
    /// [`TypeCheck::unknown`] does not report): what [`TypeCheck::drop_unknown`] removes.
    pub unknown_at: Vec<FieldPath>,
}

impl TypeCheck {
    /// Removes the fields the type does not know from `obj` (the object this check decoded), as
    /// Kubernetes does by decoding a built-in kind into its Go type: they are never stored.
    pub fn drop_unknown(&self, obj: &mut Value) {
        for path in &self.unknown_at {
            path.remove_from(obj);
        }
    }
}

/// The location of a field in an object: keys and array indices from the top.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldPath(Vec<typed::Seg>);

impl FieldPath {
    /// Removes the field at this path from `obj`, if it is there.
    fn remove_from(&self, obj: &mut Value) {
        let Some((typed::Seg::Key(last), parent)) = self.0.split_last() else {
            return;
        };
        let mut cur = obj;
        for seg in parent {
            let next = match seg {
                typed::Seg::Key(k) => cur.get_mut(k.as_str()),
                typed::Seg::Index(i) => cur.get_mut(*i),
            };
            match next {
                Some(v) => cur = v,
                None => return,
            }
        }
        if let Some(map) = cur.as_object_mut() {
            map.remove(last.as_str());
        }
    }
}

/// Decodes `obj` into its kind's type once and reports both type errors and unknown fields,
/// for callers that need both (a write checks the client's body for both, then validates the
/// defaulted object with [`validate_with_type_errors`] without decoding again).
pub fn check_types(group: &str, version: &str, kind: &str, obj: &Value) -> TypeCheck {
    let Some(decode) = typed::decoder(group, version, kind) else {
        return TypeCheck::default();
    };
    let decoded = typed::decode(decode, obj);
    TypeCheck {
        type_errors: decoded.errors,
        unknown: decoded.unknown,
        unknown_at: decoded.unknown_at.into_iter().map(FieldPath).collect(),
    }
}

/// [`validate`] with the type errors already known (from [`check_types`]).
pub fn validate_with_type_errors(
    group: &str,
    kind: &str,
    obj: &Value,
    old: Option<&Value>,
    type_errors: Vec<Cause>,
) -> Vec<Cause> {
    let mut typed = type_errors;
    typed.retain(|c| !checked_by_rules(group, kind, c));
    let mut errs = validate_object_meta(obj, name_rule(group, kind));
    if let Some(old) = old {
        errs.extend(validate_object_meta_update(obj, old));
    }
    let e = &mut errs;
    match (group, kind) {
        ("", "Pod") => pod(e, obj, old),
        ("", "PodTemplate") => pod_template(e, at(obj, "template"), "template"),
        ("", "ReplicationController") => replication_controller(e, obj),
        ("", "Service") => service(e, obj, old),
        ("", "Namespace") => {
            for f in arr(at(obj, "spec"), "finalizers") {
                qualified_name(e, f.as_str().unwrap_or(""), "spec.finalizers");
            }
        }
        ("", "ConfigMap") => config_map(e, obj, old),
        ("", "Secret") => secret(e, obj, old),
        ("apps", "Deployment") => deployment(e, obj, old),
        ("apps", "ReplicaSet") => replica_set(e, obj, old),
        ("apps", "StatefulSet") => stateful_set(e, obj, old),
        ("apps", "DaemonSet") => daemon_set(e, obj, old),
        ("apps", "ControllerRevision") => {
            if at(obj, "data").is_null() {
                e.push(Cause::required("data", "data is mandatory"));
            }
            non_negative(e, obj, "revision", "revision");
        }
        ("batch", "Job") => job(e, obj, old),
        ("batch", "CronJob") => cron_job(e, obj, old),
        ("autoscaling", "HorizontalPodAutoscaler") => hpa(e, obj),
        ("coordination.k8s.io", "Lease") => {
            let spec = at(obj, "spec");
            if let Some(d) = int(spec, "leaseDurationSeconds") {
                if d <= 0 {
                    e.push(Cause::invalid(
                        "spec.leaseDurationSeconds",
                        &json!(d),
                        "must be greater than 0",
                    ));
                }
            }
            non_negative(e, spec, "leaseTransitions", "spec.leaseTransitions");
        }
        _ => {}
    }
    // A value of the wrong type was already reported; rules that then misread it (an "empty"
    // selector that is really a string) would only add noise.
    let shadowed = |field: &str| {
        typed.iter().any(|t| {
            field
                .strip_prefix(t.field.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
        })
    };
    errs.retain(|c| !shadowed(&c.field));
    typed.extend(errs);
    typed
}

/// Whether a type error is one the kind's rules report themselves, with Kubernetes' paths and
/// words: base64 byte fields (`data[key]` of a Secret, `binaryData[key]` of a ConfigMap, but not
/// ConfigMap `data`), whose decoder reports are dropped in favour of the rules'.
pub fn checked_by_rules(group: &str, kind: &str, type_error: &Cause) -> bool {
    let byte_field = match (group, kind) {
        ("", "Secret") => "data.",
        ("", "ConfigMap") => "binaryData.",
        _ => return false,
    };
    type_error.field.starts_with(byte_field)
}

/// Paths of fields in `obj` that the kind's schema does not know, as `spec.foo` or
/// `spec.template.spec.containers[0].imagee` (what `unknown field "…"` names). Empty for kinds
/// without a typed schema here (custom resources).
///
/// Found as the keys the k8s-openapi type's decoder passes over. `null` values are skipped
/// (known or not, they set nothing), as are values that failed to decode (those are type
/// errors, not unknown).
pub fn unknown_fields(group: &str, version: &str, kind: &str, obj: &Value) -> Vec<String> {
    match typed::decoder(group, version, kind) {
        Some(decode) => typed::decode(decode, obj).unknown,
        None => Vec::new(),
    }
}

/// Fields whose JSON type does not fit the kind's schema, as `FieldValueInvalid` causes
/// (`spec.replicas: Invalid value: "3": invalid type: string "3", expected int32`).
pub fn type_errors(group: &str, version: &str, kind: &str, obj: &Value) -> Vec<Cause> {
    match typed::decoder(group, version, kind) {
        // Most objects decode: checking that needs no round trip back to JSON.
        Some(decode) if decode.fits(obj) => Vec::new(),
        Some(decode) => typed::decode(decode, obj).errors,
        None => Vec::new(),
    }
}

/// [`type_errors`] of an object whose every part but `status` is a stored object's, as a
/// `/status` write builds it: only `status` is decoded (a pod's spec, most of its JSON, was
/// checked when it was written). The whole object is decoded when that finds an error, for the
/// causes' paths, and for kinds without a typed status.
pub fn status_type_errors(group: &str, version: &str, kind: &str, obj: &Value) -> Vec<Cause> {
    match typed::decoder(group, version, kind) {
        Some(decode) if decode.status_fits(obj) => Vec::new(),
        _ => type_errors(group, version, kind, obj),
    }
}

/// Which name format a kind's `metadata.name` must have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameRule {
    /// DNS-1123 subdomain (`example.com`): most kinds, and custom resources.
    Subdomain,
    /// DNS-1123 label (`my-name`): Namespaces.
    Label,
    /// DNS-1035 label (starts with a letter): Services.
    Dns1035,
    /// Only a valid URL path segment.
    PathSegment,
}

/// The name rule Kubernetes applies to a kind.
pub fn name_rule(group: &str, kind: &str) -> NameRule {
    match (group, kind) {
        ("", "Namespace") => NameRule::Label,
        ("", "Service") => NameRule::Dns1035,
        // RBAC object names (`system:controller:…`) only need to be path segments.
        ("rbac.authorization.k8s.io", _) => NameRule::PathSegment,
        _ => NameRule::Subdomain,
    }
}

fn check_name(rule: NameRule, name: &str, prefix: bool) -> Vec<String> {
    // A generateName prefix may end in `-`; upstream masks that before checking.
    let masked;
    let name = if prefix && name.ends_with('-') && rule != NameRule::PathSegment {
        masked = format!("{}a", &name[..name.len() - 1]);
        masked.as_str()
    } else {
        name
    };
    let result = match rule {
        NameRule::Subdomain => names::is_dns1123_subdomain(name),
        NameRule::Label => names::is_dns1123_label(name),
        NameRule::Dns1035 => names::is_dns1035_label(name),
        NameRule::PathSegment => {
            if prefix {
                // `.` and `..` are fine as prefixes: a suffix follows.
                let errs: Vec<String> = ["/", "%"]
                    .iter()
                    .filter(|c| name.contains(**c))
                    .map(|c| format!("may not contain '{c}'"))
                    .collect();
                if errs.is_empty() {
                    Ok(())
                } else {
                    Err(errs)
                }
            } else {
                names::path_segment_name(name)
            }
        }
    };
    result.err().unwrap_or_default()
}

const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;
const MAX_SECRET_SIZE: usize = 1024 * 1024;

/// `ValidateObjectMeta`: name (or generateName), namespace format, generation, labels,
/// annotations, owner references and finalizers.
///
/// The server generates a name from `generateName` before validating; if it has not yet, a
/// lone `generateName` is accepted here.
pub fn validate_object_meta(obj: &Value, rule: NameRule) -> Vec<Cause> {
    let mut e = Vec::new();
    let meta = at(obj, "metadata");
    let name = s(meta, "name");
    let generate_name = s(meta, "generateName");
    if !generate_name.is_empty() {
        for msg in check_name(rule, generate_name, true) {
            e.push(Cause::invalid(
                "metadata.generateName",
                &json!(generate_name),
                &msg,
            ));
        }
    }
    if name.is_empty() {
        if generate_name.is_empty() {
            e.push(Cause::required(
                "metadata.name",
                "name or generateName is required",
            ));
        }
    } else {
        for msg in check_name(rule, name, false) {
            e.push(Cause::invalid("metadata.name", &json!(name), &msg));
        }
    }
    let ns = s(meta, "namespace");
    if !ns.is_empty() {
        for msg in names::is_dns1123_label(ns).err().unwrap_or_default() {
            e.push(Cause::invalid("metadata.namespace", &json!(ns), &msg));
        }
    }
    non_negative(&mut e, meta, "generation", "metadata.generation");
    labels(&mut e, at(meta, "labels"), "metadata.labels");
    annotations(&mut e, at(meta, "annotations"), "metadata.annotations");
    owner_references(&mut e, arr(meta, "ownerReferences"));
    let finalizers = arr(meta, "finalizers");
    for f in finalizers {
        qualified_name(&mut e, f.as_str().unwrap_or(""), "metadata.finalizers");
    }
    let has = |f: &str| finalizers.iter().any(|x| x == f);
    if has("orphan") && has("foregroundDeletion") {
        e.push(Cause::invalid(
            "metadata.finalizers",
            &json!(finalizers),
            "finalizer orphan and foregroundDeletion cannot be both set",
        ));
    }
    e
}

/// `ValidateObjectMetaUpdate`: name, namespace and uid cannot change, and no finalizer may be
/// added once deletion started. An empty uid in the new object means "unchanged" (the server
/// copies it from the stored object).
pub fn validate_object_meta_update(obj: &Value, old: &Value) -> Vec<Cause> {
    let mut e = Vec::new();
    let (meta, old_meta) = (at(obj, "metadata"), at(old, "metadata"));
    // An update body without a namespace gets it from the URL, so only a different one counts.
    for field in ["name", "namespace"] {
        if s(meta, field) != s(old_meta, field)
            && !(field == "namespace" && s(meta, field).is_empty())
        {
            e.push(Cause::immutable(
                format!("metadata.{field}"),
                &json!(s(meta, field)),
            ));
        }
    }
    let uid = s(meta, "uid");
    if !uid.is_empty() && uid != s(old_meta, "uid") {
        e.push(Cause::immutable("metadata.uid", &json!(uid)));
    }
    if !at(old_meta, "deletionTimestamp").is_null() {
        let before: HashSet<&str> = arr(old_meta, "finalizers")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let added: BTreeSet<&str> = arr(meta, "finalizers")
            .iter()
            .filter_map(Value::as_str)
            .filter(|f| !before.contains(f))
            .collect();
        if !added.is_empty() {
            let list: Vec<String> = added.iter().map(|f| format!("{f:?}")).collect();
            e.push(Cause::forbidden(
                "metadata.finalizers",
                &format!(
                    "no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}",
                    list.join(", ")
                ),
            ));
        }
    }
    e
}

// ---- JSON access helpers (tolerant: wrong types read as absent; the typed decode reports them) ----

static NULL: Value = Value::Null;

/// A child value (`null` when absent or when `v` is not an object).
fn at<'a>(v: &'a Value, key: &str) -> &'a Value {
    v.get(key).unwrap_or(&NULL)
}

/// A string child, `""` when absent or not a string.
fn s<'a>(v: &'a Value, key: &str) -> &'a str {
    at(v, key).as_str().unwrap_or("")
}

/// An array child, empty when absent or not an array.
fn arr<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    at(v, key).as_array().map(Vec::as_slice).unwrap_or(&[])
}

/// A map child's entries, empty when absent or not an object.
fn entries(v: &Value) -> impl Iterator<Item = (&String, &Value)> {
    v.as_object().into_iter().flatten()
}

fn int(v: &Value, key: &str) -> Option<i64> {
    at(v, key).as_i64()
}

fn present(v: &Value, key: &str) -> bool {
    !at(v, key).is_null()
}

fn child(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

fn index(path: &str, i: usize) -> String {
    format!("{path}[{i}]")
}

fn key(path: &str, k: &str) -> String {
    format!("{path}[{k}]")
}

/// A copy without `null` members, so that "absent" and "null" compare equal.
fn strip_nulls(v: &Value) -> Value {
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
fn same(a: &Value, b: &Value) -> bool {
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
fn diff_paths(a: &Value, b: &Value, path: &str, out: &mut Vec<String>, limit: usize) {
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

fn non_negative(e: &mut Vec<Cause>, v: &Value, field: &str, path: &str) {
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

fn qualified_name(e: &mut Vec<Cause>, name: &str, path: &str) {
    for msg in names::is_qualified_name(name).err().unwrap_or_default() {
        e.push(Cause::invalid(path, &json!(name), &msg));
    }
}

fn dns_label(e: &mut Vec<Cause>, name: &str, path: &str) {
    for msg in names::is_dns1123_label(name).err().unwrap_or_default() {
        e.push(Cause::invalid(path, &json!(name), &msg));
    }
}

fn dns_subdomain(e: &mut Vec<Cause>, name: &str, path: &str) {
    for msg in names::is_dns1123_subdomain(name).err().unwrap_or_default() {
        e.push(Cause::invalid(path, &json!(name), &msg));
    }
}

/// `ValidateLabels`: every key a qualified name, every value a label value; the path is the
/// map's, as upstream reports it.
fn labels(e: &mut Vec<Cause>, map: &Value, path: &str) {
    for (k, v) in entries(map) {
        qualified_name(e, k, path);
        if let Some(v) = v.as_str() {
            for msg in names::is_valid_label_value(v).err().unwrap_or_default() {
                e.push(Cause::invalid(path, &json!(v), &msg));
            }
        }
    }
}

/// `ValidateAnnotations`: keys are qualified names ignoring case; keys and values together at
/// most 256 KiB.
fn annotations(e: &mut Vec<Cause>, map: &Value, path: &str) {
    let mut total = 0;
    for (k, v) in entries(map) {
        for msg in names::is_qualified_name(&k.to_lowercase())
            .err()
            .unwrap_or_default()
        {
            e.push(Cause::invalid(path, &json!(k), &msg));
        }
        total += k.len() + v.as_str().map_or(0, str::len);
    }
    if total > TOTAL_ANNOTATION_SIZE_LIMIT {
        e.push(Cause::too_long(path, TOTAL_ANNOTATION_SIZE_LIMIT));
    }
}

fn owner_references(e: &mut Vec<Cause>, refs: &[Value]) {
    let path = "metadata.ownerReferences";
    let mut controller: Option<String> = None;
    for r in refs {
        let api_version = s(r, "apiVersion");
        let version = api_version.rsplit('/').next().unwrap_or("");
        if version.is_empty() {
            e.push(Cause::invalid(
                child(path, "apiVersion"),
                &json!(api_version),
                "version must not be empty",
            ));
        }
        for (field, what) in [("kind", "kind"), ("name", "name"), ("uid", "uid")] {
            if s(r, field).is_empty() {
                e.push(Cause::invalid(
                    child(path, field),
                    &json!(""),
                    &format!("{what} must not be empty"),
                ));
            }
        }
        if at(r, "controller").as_bool() == Some(true) {
            let this = format!("{}/{}", s(r, "kind"), s(r, "name"));
            match &controller {
                Some(first) => e.push(Cause::invalid(
                    path,
                    &Value::Array(refs.to_vec()),
                    &format!(
                        "Only one reference can have Controller set to true. Found \"true\" in references for {first} and {this}"
                    ),
                )),
                None => controller = Some(this),
            }
        }
    }
}

/// `ValidateLabelSelector` on a `metav1.LabelSelector`.
fn label_selector(e: &mut Vec<Cause>, sel: &Value, path: &str) {
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

fn is_empty_selector(sel: &Value) -> bool {
    entries(at(sel, "matchLabels")).next().is_none() && arr(sel, "matchExpressions").is_empty()
}

fn not_supported(e: &mut Vec<Cause>, path: impl Into<String>, value: &str, supported: &[&str]) {
    e.push(Cause::not_supported(path, &json!(value), supported));
}

/// A required enum field: `Required value` when empty, `Unsupported value` when unknown.
fn enum_field(e: &mut Vec<Cause>, value: &str, path: &str, supported: &[&str]) {
    if value.is_empty() {
        e.push(Cause::required(path, ""));
    } else if !supported.contains(&value) {
        not_supported(e, path, value, supported);
    }
}

/// An optional enum field: checked only when set.
fn optional_enum(e: &mut Vec<Cause>, v: &Value, field: &str, path: &str, supported: &[&str]) {
    if let Some(value) = at(v, field).as_str() {
        if !supported.contains(&value) {
            not_supported(e, path, value, supported);
        }
    }
}

// ---- quantities ----

/// The value of a resource quantity (`100m`, `1.5Gi`, `2e3`, or a JSON number), or `None` when
/// it does not match Kubernetes' quantity grammar.
pub fn parse_quantity(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => parse_quantity_str(s),
        _ => None,
    }
}

fn parse_quantity_str(s: &str) -> Option<f64> {
    let (sign, rest) = match s.as_bytes().first()? {
        b'+' => (1.0, &s[1..]),
        b'-' => (-1.0, &s[1..]),
        _ => (1.0, s),
    };
    let num_len = rest
        .bytes()
        .take_while(|c| c.is_ascii_digit() || *c == b'.')
        .count();
    let (num, suffix) = rest.split_at(num_len);
    if num.is_empty() || num == "." || num.matches('.').count() > 1 {
        return None;
    }
    let base: f64 = num
        .parse()
        .ok()
        .or_else(|| format!("{num}0").parse().ok())?;
    let factor = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        exp if exp.starts_with(['e', 'E']) => {
            let digits = &exp[1..];
            let unsigned = digits.strip_prefix(['+', '-']).unwrap_or(digits);
            if unsigned.is_empty() || !unsigned.bytes().all(|c| c.is_ascii_digit()) {
                return None;
            }
            10f64.powi(digits.parse::<i32>().ok()?)
        }
        _ => return None,
    };
    Some(sign * base * factor)
}

fn quantity_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

const QUANTITY_FORMAT_ERROR: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";

fn resources(e: &mut Vec<Cause>, res: &Value, path: &str) {
    for part in ["limits", "requests"] {
        for (name, q) in entries(at(res, part)) {
            let p = key(&child(path, part), name);
            match parse_quantity(q) {
                None => e.push(Cause::invalid(p, q, QUANTITY_FORMAT_ERROR)),
                Some(x) if x < 0.0 => e.push(Cause::invalid(
                    p,
                    &json!(quantity_text(q)),
                    "must be greater than or equal to 0",
                )),
                _ => {}
            }
        }
    }
    for (name, req) in entries(at(res, "requests")) {
        let Some(limit) = at(res, "limits").get(name.as_str()) else {
            continue;
        };
        if let (Some(r), Some(l)) = (parse_quantity(req), parse_quantity(limit)) {
            if r > l {
                e.push(Cause::invalid(
                    child(path, "requests"),
                    &json!(quantity_text(req)),
                    &format!(
                        "must be less than or equal to {name} limit of {}",
                        quantity_text(limit)
                    ),
                ));
            }
        }
    }
}

// ---- pods ----

#[derive(Clone, Copy, PartialEq, Eq)]
enum ContainerKind {
    Regular,
    Init,
}

fn pod(e: &mut Vec<Cause>, obj: &Value, old: Option<&Value>) {
    let spec = at(obj, "spec");
    match old {
        None => {
            pod_spec(e, spec, "spec");
            if !arr(spec, "ephemeralContainers").is_empty() {
                e.push(Cause::forbidden(
                    "spec.ephemeralContainers",
                    "cannot be set on create",
                ));
            }
        }
        Some(old) => {
            let old_spec = at(old, "spec");
            // A spec the update leaves as it was (every status write, every label change) was
            // validated when it was written; upstream's status updates do not look at it either.
            if same(spec, old_spec) {
                return;
            }
            pod_spec(e, spec, "spec");
            pod_update(e, spec, old_spec);
        }
    }
}

const POD_UPDATE_MESSAGE: &str = "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)";

/// `ValidatePodUpdate`: a pod's spec is immutable except container images, a shorter
/// `activeDeadlineSeconds`, added tolerations and removed scheduling gates.
fn pod_update(e: &mut Vec<Cause>, new: &Value, old: &Value) {
    match (
        int(new, "activeDeadlineSeconds"),
        int(old, "activeDeadlineSeconds"),
    ) {
        (Some(n), _) if !(0..=i64::from(i32::MAX)).contains(&n) => {
            e.push(Cause::invalid(
                "spec.activeDeadlineSeconds",
                &json!(n),
                &names::inclusive_range_error(0, i64::from(i32::MAX)),
            ));
            return;
        }
        (Some(n), Some(o)) if n > o => {
            e.push(Cause::invalid(
                "spec.activeDeadlineSeconds",
                &json!(n),
                "must be less than or equal to previous value",
            ));
            return;
        }
        (None, Some(_)) => {
            e.push(Cause::invalid(
                "spec.activeDeadlineSeconds",
                &Value::Null,
                "must not update from a positive integer to nil value",
            ));
        }
        _ => {}
    }
    let mut munged = strip_nulls(new);
    let old = strip_nulls(old);
    let (Some(m), Some(o)) = (munged.as_object_mut(), old.as_object()) else {
        return;
    };
    for list in ["containers", "initContainers"] {
        let old_list = o.get(list).and_then(Value::as_array);
        if let (Some(new_list), Some(old_list)) =
            (m.get_mut(list).and_then(Value::as_array_mut), old_list)
        {
            if new_list.len() == old_list.len() {
                for (n, o) in new_list.iter_mut().zip(old_list) {
                    if let (Some(n), Some(img)) = (n.as_object_mut(), o.get("image")) {
                        n.insert("image".into(), img.clone());
                    }
                }
            }
        }
    }
    // Fields that may change (validated above) or that other endpoints own compare as the old.
    let take_old = |field: &str, m: &mut Map<String, Value>| match o.get(field) {
        Some(v) => {
            m.insert(field.into(), v.clone());
        }
        None => {
            m.remove(field);
        }
    };
    take_old("activeDeadlineSeconds", m);
    take_old("ephemeralContainers", m);
    let old_tolerations = o
        .get("tolerations")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let new_tolerations = m
        .get("tolerations")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if old_tolerations.iter().all(|t| new_tolerations.contains(t)) {
        take_old("tolerations", m);
    }
    let old_gates = o
        .get("schedulingGates")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let new_gates = m
        .get("schedulingGates")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if new_gates.iter().all(|g| old_gates.contains(g)) {
        take_old("schedulingGates", m);
    }
    let old_grace = o
        .get("terminationGracePeriodSeconds")
        .and_then(Value::as_i64);
    if old_grace.is_some_and(|g| g < 0)
        && m.get("terminationGracePeriodSeconds")
            .and_then(Value::as_i64)
            == Some(1)
    {
        take_old("terminationGracePeriodSeconds", m);
    }
    if munged != old {
        let mut changed = Vec::new();
        diff_paths(&old, &munged, "spec", &mut changed, 5);
        e.push(Cause::forbidden(
            "spec",
            &format!("{POD_UPDATE_MESSAGE}\n  changed: {}", changed.join(", ")),
        ));
    }
}

/// `ValidatePodTemplateSpec`: template labels and annotations (at `<path>.labels`, as upstream
/// names them) and the pod spec.
fn pod_template(e: &mut Vec<Cause>, template: &Value, path: &str) {
    let meta = at(template, "metadata");
    labels(e, at(meta, "labels"), &child(path, "labels"));
    annotations(e, at(meta, "annotations"), &child(path, "annotations"));
    let spec = at(template, "spec");
    pod_spec(e, spec, &child(path, "spec"));
    if !arr(spec, "ephemeralContainers").is_empty() {
        e.push(Cause::forbidden(
            child(path, "spec.ephemeralContainers"),
            "ephemeral containers not allowed in pod template",
        ));
    }
}

fn pod_spec(e: &mut Vec<Cause>, spec: &Value, path: &str) {
    let mut volumes = HashSet::new();
    for (i, v) in arr(spec, "volumes").iter().enumerate() {
        volume(e, v, &index(&child(path, "volumes"), i), &mut volumes);
    }
    let containers = arr(spec, "containers");
    if containers.is_empty() {
        e.push(Cause::required(child(path, "containers"), ""));
    }
    let mut names_seen = HashSet::new();
    for (i, c) in containers.iter().enumerate() {
        container(
            e,
            c,
            &index(&child(path, "containers"), i),
            &volumes,
            &mut names_seen,
            ContainerKind::Regular,
        );
    }
    for (i, c) in arr(spec, "initContainers").iter().enumerate() {
        container(
            e,
            c,
            &index(&child(path, "initContainers"), i),
            &volumes,
            &mut names_seen,
            ContainerKind::Init,
        );
    }
    enum_field(
        e,
        s(spec, "restartPolicy"),
        &child(path, "restartPolicy"),
        &["Always", "OnFailure", "Never"],
    );
    enum_field(
        e,
        s(spec, "dnsPolicy"),
        &child(path, "dnsPolicy"),
        &["ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"],
    );
    labels(e, at(spec, "nodeSelector"), &child(path, "nodeSelector"));
    for (field, check) in [
        (
            "serviceAccountName",
            dns_subdomain as fn(&mut Vec<Cause>, &str, &str),
        ),
        ("nodeName", dns_subdomain),
        ("hostname", dns_label),
        ("subdomain", dns_label),
    ] {
        let v = s(spec, field);
        if !v.is_empty() {
            check(e, v, &child(path, field));
        }
    }
    if let Some(n) = int(spec, "activeDeadlineSeconds") {
        if !(1..=i64::from(i32::MAX)).contains(&n) {
            e.push(Cause::invalid(
                child(path, "activeDeadlineSeconds"),
                &json!(n),
                &names::inclusive_range_error(1, i64::from(i32::MAX)),
            ));
        }
    }
    for (i, t) in arr(spec, "tolerations").iter().enumerate() {
        toleration(e, t, &index(&child(path, "tolerations"), i));
    }
}

fn volume(e: &mut Vec<Cause>, v: &Value, path: &str, seen: &mut HashSet<String>) {
    let name = s(v, "name");
    if name.is_empty() {
        e.push(Cause::required(child(path, "name"), ""));
    } else {
        dns_label(e, name, &child(path, "name"));
        if !seen.insert(name.to_string()) {
            e.push(Cause::duplicate(child(path, "name"), &json!(name)));
        }
    }
    let sources: Vec<&String> = entries(v)
        .filter(|(k, x)| k.as_str() != "name" && !x.is_null())
        .map(|(k, _)| k)
        .collect();
    match sources.as_slice() {
        [] => e.push(Cause::required(path, "must specify a volume type")),
        [_] => {}
        [_, second, ..] => e.push(Cause::forbidden(
            child(path, second),
            "may not specify more than 1 volume type",
        )),
    }
}

fn container(
    e: &mut Vec<Cause>,
    c: &Value,
    path: &str,
    volumes: &HashSet<String>,
    names_seen: &mut HashSet<String>,
    kind: ContainerKind,
) {
    let name = s(c, "name");
    if name.is_empty() {
        e.push(Cause::required(child(path, "name"), ""));
    } else {
        dns_label(e, name, &child(path, "name"));
        if !names_seen.insert(name.to_string()) {
            e.push(Cause::duplicate(child(path, "name"), &json!(name)));
        }
    }
    let image = s(c, "image");
    if image.is_empty() {
        e.push(Cause::required(child(path, "image"), ""));
    } else if image.trim() != image {
        e.push(Cause::invalid(
            child(path, "image"),
            &json!(image),
            "must not have leading or trailing whitespace",
        ));
    }
    enum_field(
        e,
        s(c, "imagePullPolicy"),
        &child(path, "imagePullPolicy"),
        &["Always", "IfNotPresent", "Never"],
    );
    if let Some(policy) = at(c, "terminationMessagePolicy").as_str() {
        if !["File", "FallbackToLogsOnError"].contains(&policy) {
            not_supported(
                e,
                child(path, "terminationMessagePolicy"),
                policy,
                &["File", "FallbackToLogsOnError"],
            );
        }
    }
    if present(c, "restartPolicy") {
        let rp = s(c, "restartPolicy");
        match kind {
            ContainerKind::Regular => e.push(Cause::forbidden(
                child(path, "restartPolicy"),
                "may not be set for non-init containers",
            )),
            ContainerKind::Init if rp != "Always" => {
                not_supported(e, child(path, "restartPolicy"), rp, &["Always"])
            }
            ContainerKind::Init => {}
        }
    }
    container_ports(e, arr(c, "ports"), &child(path, "ports"));
    for (i, env) in arr(c, "env").iter().enumerate() {
        env_var(e, env, &index(&child(path, "env"), i));
    }
    let mut mount_paths = HashSet::new();
    for (i, m) in arr(c, "volumeMounts").iter().enumerate() {
        let p = index(&child(path, "volumeMounts"), i);
        let mname = s(m, "name");
        if mname.is_empty() {
            e.push(Cause::required(child(&p, "name"), ""));
        } else if !volumes.contains(mname) {
            e.push(Cause::new(
                "FieldValueNotFound",
                child(&p, "name"),
                format!("Not found: {mname:?}"),
            ));
        }
        let mpath = s(m, "mountPath");
        if mpath.is_empty() {
            e.push(Cause::required(child(&p, "mountPath"), ""));
        } else if !mount_paths.insert(mpath.to_string()) {
            e.push(Cause::invalid(
                child(&p, "mountPath"),
                &json!(mpath),
                "must be unique",
            ));
        }
    }
    resources(e, at(c, "resources"), &child(path, "resources"));
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        let p = at(c, probe);
        if p.is_null() {
            continue;
        }
        if kind == ContainerKind::Init && at(c, "restartPolicy").as_str() != Some("Always") {
            e.push(Cause::forbidden(
                child(path, probe),
                "may not be set for init containers without restartPolicy=Always",
            ));
            continue;
        }
        let pp = child(path, probe);
        handler(e, p, &pp, &["exec", "httpGet", "tcpSocket", "grpc"]);
        for field in [
            "initialDelaySeconds",
            "timeoutSeconds",
            "periodSeconds",
            "successThreshold",
            "failureThreshold",
        ] {
            non_negative(e, p, field, &child(&pp, field));
        }
        if probe != "readinessProbe" {
            if let Some(n) = int(p, "successThreshold") {
                if n != 1 {
                    e.push(Cause::invalid(
                        child(&pp, "successThreshold"),
                        &json!(n),
                        "must be 1",
                    ));
                }
            }
        }
    }
    for hook in ["postStart", "preStop"] {
        let h = at(at(c, "lifecycle"), hook);
        if !h.is_null() {
            handler(
                e,
                h,
                &child(path, &format!("lifecycle.{hook}")),
                &["exec", "httpGet", "tcpSocket", "sleep"],
            );
        }
    }
}

/// A probe or lifecycle handler has exactly one action; its port, if any, must be valid.
fn handler(e: &mut Vec<Cause>, h: &Value, path: &str, kinds: &[&str]) {
    let set: Vec<&&str> = kinds.iter().filter(|k| present(h, k)).collect();
    match set.as_slice() {
        [] => e.push(Cause::required(path, "must specify a handler type")),
        [_] => {}
        [_, second, ..] => e.push(Cause::forbidden(
            child(path, second),
            "may not specify more than 1 handler type",
        )),
    }
    for action in ["httpGet", "tcpSocket", "grpc"] {
        let port = at(at(h, action), "port");
        let p = child(path, &format!("{action}.port"));
        match port {
            Value::Null => {}
            Value::String(name) if action != "grpc" => {
                for msg in names::is_valid_port_name(name).err().unwrap_or_default() {
                    e.push(Cause::invalid(&p, port, &msg));
                }
            }
            other => {
                if let Some(n) = other.as_i64() {
                    for msg in names::is_valid_port_num(n).err().unwrap_or_default() {
                        e.push(Cause::invalid(&p, port, &msg));
                    }
                }
            }
        }
    }
}

fn container_ports(e: &mut Vec<Cause>, ports: &[Value], path: &str) {
    let mut names_seen = HashSet::new();
    for (i, port) in ports.iter().enumerate() {
        let p = index(path, i);
        let name = s(port, "name");
        if !name.is_empty() {
            for msg in names::is_valid_port_name(name).err().unwrap_or_default() {
                e.push(Cause::invalid(child(&p, "name"), &json!(name), &msg));
            }
            if !names_seen.insert(name.to_string()) {
                e.push(Cause::duplicate(child(&p, "name"), &json!(name)));
            }
        }
        match int(port, "containerPort") {
            None | Some(0) => e.push(Cause::required(child(&p, "containerPort"), "")),
            Some(n) => {
                for msg in names::is_valid_port_num(n).err().unwrap_or_default() {
                    e.push(Cause::invalid(child(&p, "containerPort"), &json!(n), &msg));
                }
            }
        }
        if let Some(n) = int(port, "hostPort").filter(|n| *n != 0) {
            for msg in names::is_valid_port_num(n).err().unwrap_or_default() {
                e.push(Cause::invalid(child(&p, "hostPort"), &json!(n), &msg));
            }
        }
        enum_field(
            e,
            s(port, "protocol"),
            &child(&p, "protocol"),
            &["SCTP", "TCP", "UDP"],
        );
    }
}

fn env_var(e: &mut Vec<Cause>, env: &Value, path: &str) {
    let name = s(env, "name");
    if name.is_empty() {
        e.push(Cause::required(child(path, "name"), ""));
    } else if !name
        .bytes()
        .all(|c| (b' '..=b'~').contains(&c) && c != b'=')
    {
        e.push(Cause::invalid(
            child(path, "name"),
            &json!(name),
            "a valid environment variable name must consist only of printable ASCII characters other than '='",
        ));
    }
    let from = at(env, "valueFrom");
    if from.is_null() {
        return;
    }
    let sources = [
        "fieldRef",
        "resourceFieldRef",
        "configMapKeyRef",
        "secretKeyRef",
    ];
    let count = sources.iter().filter(|k| present(from, k)).count();
    let p = child(path, "valueFrom");
    if !s(env, "value").is_empty() {
        e.push(Cause::invalid(
            &p,
            &json!(""),
            "may not be specified when `value` is not empty",
        ));
    }
    if count == 0 {
        e.push(Cause::invalid(
            &p,
            &json!(""),
            "must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`",
        ));
    } else if count > 1 {
        e.push(Cause::invalid(
            &p,
            &json!(""),
            "may not have more than one field specified at a time",
        ));
    }
    let field_ref = at(from, "fieldRef");
    if !field_ref.is_null() && s(field_ref, "fieldPath").is_empty() {
        e.push(Cause::required(child(&p, "fieldRef.fieldPath"), ""));
    }
    for source in ["configMapKeyRef", "secretKeyRef"] {
        let r = at(from, source);
        if !r.is_null() && s(r, "key").is_empty() {
            e.push(Cause::required(child(&p, &format!("{source}.key")), ""));
        }
    }
}

fn toleration(e: &mut Vec<Cause>, t: &Value, path: &str) {
    let k = s(t, "key");
    if !k.is_empty() {
        qualified_name(e, k, &child(path, "key"));
    }
    let op = s(t, "operator");
    if k.is_empty() && op != "Exists" {
        e.push(Cause::invalid(
            child(path, "operator"),
            &json!(op),
            "operator must be Exists when `key` is empty, which means \"match all values and all keys\"",
        ));
    }
    match op {
        "" | "Equal" => {}
        "Exists" => {
            if !s(t, "value").is_empty() {
                e.push(Cause::invalid(
                    child(path, "operator"),
                    &json!(s(t, "value")),
                    "value must be empty when `operator` is 'Exists'",
                ));
            }
        }
        other => not_supported(e, child(path, "operator"), other, &["Equal", "Exists"]),
    }
    let effect = s(t, "effect");
    if !effect.is_empty() && !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect) {
        not_supported(
            e,
            child(path, "effect"),
            effect,
            &["NoSchedule", "PreferNoSchedule", "NoExecute"],
        );
    }
    if present(t, "tolerationSeconds") && effect != "NoExecute" {
        e.push(Cause::invalid(
            child(path, "effect"),
            &json!(effect),
            "effect must be 'NoExecute' when `tolerationSeconds` is set",
        ));
    }
}

// ---- workloads ----

/// `spec.selector` of an apps/v1 workload: required, well-formed and not empty; returns the
/// parsed selector when it converts. `what` names the kind in upstream's message.
fn workload_selector(e: &mut Vec<Cause>, spec: &Value, what: &str) -> Option<LabelSelector> {
    let sel = at(spec, "selector");
    if sel.is_null() {
        e.push(Cause::required("spec.selector", ""));
        return None;
    }
    label_selector(e, sel, "spec.selector");
    if is_empty_selector(sel) {
        e.push(Cause::invalid(
            "spec.selector",
            sel,
            &format!("empty selector is invalid for {what}"),
        ));
    }
    match LabelSelector::from_label_selector_json(sel) {
        Ok(s) => Some(s),
        Err(_) => {
            e.push(Cause::invalid(
                "spec.selector",
                sel,
                "invalid label selector",
            ));
            None
        }
    }
}

/// The pod template of a controller: labels must match the selector, the pod must restart
/// `Always`, and it may not have a deadline.
fn controller_template(
    e: &mut Vec<Cause>,
    spec: &Value,
    selector: Option<&LabelSelector>,
    kind: &str,
) {
    let template = at(spec, "template");
    if template.is_null() {
        e.push(Cause::required("spec.template", ""));
        return;
    }
    if let Some(sel) = selector.filter(|s| !s.is_empty()) {
        if !sel.matches_object(template) {
            e.push(Cause::invalid(
                "spec.template.metadata.labels",
                at(at(template, "metadata"), "labels"),
                "`selector` does not match template `labels`",
            ));
        }
    }
    pod_template(e, template, "spec.template");
    let pod_spec = at(template, "spec");
    let rp = s(pod_spec, "restartPolicy");
    if !rp.is_empty() && rp != "Always" {
        not_supported(e, "spec.template.spec.restartPolicy", rp, &["Always"]);
    }
    let deadline = at(pod_spec, "activeDeadlineSeconds");
    if kind == "DaemonSet" && !deadline.is_null() {
        e.push(Cause::invalid(
            "spec.template.spec.activeDeadlineSeconds",
            deadline,
            "activeDeadlineSeconds must be nil for daemon sets",
        ));
    } else if !deadline.is_null() {
        e.push(Cause::forbidden(
            "spec.template.spec.activeDeadlineSeconds",
            &format!("activeDeadlineSeconds in {kind} is not Supported"),
        ));
    }
}

fn immutable_selector(e: &mut Vec<Cause>, obj: &Value, old: Option<&Value>) {
    if let Some(old) = old {
        let (new_sel, old_sel) = (
            at(at(obj, "spec"), "selector"),
            at(at(old, "spec"), "selector"),
        );
        if !same(new_sel, old_sel) {
            e.push(Cause::immutable("spec.selector", new_sel));
        }
    }
}

fn deployment(e: &mut Vec<Cause>, obj: &Value, old: Option<&Value>) {
    let spec = at(obj, "spec");
    non_negative(e, spec, "replicas", "spec.replicas");
    let selector = workload_selector(e, spec, "deployment");
    controller_template(e, spec, selector.as_ref(), "ReplicaSet");
    deployment_strategy(e, at(spec, "strategy"));
    non_negative(e, spec, "minReadySeconds", "spec.minReadySeconds");
    non_negative(e, spec, "revisionHistoryLimit", "spec.revisionHistoryLimit");
    if let Some(pd) = int(spec, "progressDeadlineSeconds") {
        non_negative(
            e,
            spec,
            "progressDeadlineSeconds",
            "spec.progressDeadlineSeconds",
        );
        if pd <= int(spec, "minReadySeconds").unwrap_or(0) {
            e.push(Cause::invalid(
                "spec.progressDeadlineSeconds",
                &json!(pd),
                "must be greater than minReadySeconds",
            ));
        }
    }
    immutable_selector(e, obj, old);
}

/// The number an int-or-percent stands for when compared with zero.
fn int_or_percent_value(v: &Value) -> Option<i64> {
    match v {
        Value::String(s) => s.strip_suffix('%').and_then(|n| n.parse().ok()),
        other => other.as_i64(),
    }
}

fn positive_int_or_percent(e: &mut Vec<Cause>, v: &Value, path: &str) {
    match v {
        Value::String(s) => {
            let valid = s
                .strip_suffix('%')
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()));
            if !valid {
                e.push(Cause::invalid(
                    path,
                    v,
                    "must be an integer or percentage (e.g '5%')",
                ));
            }
        }
        other => {
            if other.as_i64().is_some_and(|n| n < 0) {
                e.push(Cause::invalid(
                    path,
                    v,
                    "must be greater than or equal to 0",
                ));
            }
        }
    }
}

fn deployment_strategy(e: &mut Vec<Cause>, strategy: &Value) {
    let ru = at(strategy, "rollingUpdate");
    match s(strategy, "type") {
        "Recreate" => {
            if !ru.is_null() {
                e.push(Cause::forbidden(
                    "spec.strategy.rollingUpdate",
                    "may not be specified when strategy `type` is 'Recreate'",
                ));
            }
        }
        "RollingUpdate" => {
            if ru.is_null() {
                e.push(Cause::required(
                    "spec.strategy.rollingUpdate",
                    "this should be defaulted and never be nil",
                ));
                return;
            }
            let (unavailable, surge) = (at(ru, "maxUnavailable"), at(ru, "maxSurge"));
            positive_int_or_percent(e, unavailable, "spec.strategy.rollingUpdate.maxUnavailable");
            positive_int_or_percent(e, surge, "spec.strategy.rollingUpdate.maxSurge");
            if int_or_percent_value(unavailable).unwrap_or(0) == 0
                && int_or_percent_value(surge).unwrap_or(0) == 0
            {
                e.push(Cause::invalid(
                    "spec.strategy.rollingUpdate.maxUnavailable",
                    unavailable,
                    "may not be 0 when `maxSurge` is 0",
                ));
            }
            if let Value::String(s) = unavailable {
                if int_or_percent_value(unavailable).is_some_and(|n| n > 100) {
                    e.push(Cause::invalid(
                        "spec.strategy.rollingUpdate.maxUnavailable",
                        &json!(s),
                        "must not be greater than 100%",
                    ));
                }
            }
        }
        other => not_supported(
            e,
            "spec.strategy.type",
            other,
            &["Recreate", "RollingUpdate"],
        ),
    }
}

fn replica_set(e: &mut Vec<Cause>, obj: &Value, old: Option<&Value>) {
    let spec = at(obj, "spec");
    non_negative(e, spec, "replicas", "spec.replicas");
    non_negative(e, spec, "minReadySeconds", "spec.minReadySeconds");
    // Upstream's ReplicaSet message does say "deployment".
    let selector = workload_selector(e, spec, "deployment");
    controller_template(e, spec, selector.as_ref(), "ReplicaSet");
    immutable_selector(e, obj, old);
}

fn replication_controller(e: &mut Vec<Cause>, obj: &Value) {
    let spec = at(obj, "spec");
    non_negative(e, spec, "minReadySeconds", "spec.minReadySeconds");
    non_negative(e, spec, "replicas", "spec.replicas");
    let sel = at(spec, "selector");
    if entries(sel).next().is_none() {
        e.push(Cause::required("spec.selector", ""));
    }
    labels(e, sel, "spec.selector");
    let pairs: Vec<(&String, &str)> = entries(sel)
        .filter_map(|(k, v)| v.as_str().map(|v| (k, v)))
        .collect();
    let reqs = pairs
        .iter()
        .filter_map(|(k, v)| {
            setpoint_api::selector::Requirement::new(
                k.as_str(),
                setpoint_api::selector::Operator::Equals,
                [*v],
            )
            .ok()
        })
        .collect();
    let selector = LabelSelector::from_requirements(reqs);
    controller_template(e, spec, Some(&selector), "ReplicationController");
}

fn stateful_set(e: &mut Vec<Cause>, obj: &Value, old: Option<&Value>) {
    let spec = at(obj, "spec");
    optional_enum(
        e,
        spec,
        "podManagementPolicy",
        "spec.podManagementPolicy",
        &["OrderedReady", "Parallel"],
    );
    let us = at(spec, "updateStrategy");
    match s(us, "type") {
        "RollingUpdate" => {
            let ru = at(us, "rollingUpdate");
            non_negative(
                e,
                ru,
                "partition",
                "spec.updateStrategy.rollingUpdate.partition",
            );
        }
        "OnDelete" => {
            if present(us, "rollingUpdate") {
                e.push(Cause::invalid(
                    "spec.updateStrategy.rollingUpdate",
                    at(us, "rollingUpdate"),
                    "only allowed for updateStrategy 'RollingUpdate'",
                ));
            }
        }
        "" => e.push(Cause::required("spec.updateStrategy", "")),
        other => not_supported(
            e,
            "spec.updateStrategy",
            other,
            &["OnDelete", "RollingUpdate"],
        ),
    }
    let policy = at(spec, "persistentVolumeClaimRetentionPolicy");
    for field in ["whenDeleted", "whenScaled"] {
        optional_enum(
            e,
            policy,
            field,
            &format!("spec.persistentVolumeClaimRetentionPolicy.{field}"),
            &["Retain", "Delete"],
        );
    }
    non_negative(e, spec, "replicas", "spec.replicas");
    non_negative(e, spec, "minReadySeconds", "spec.minReadySeconds");
    non_negative(e, spec, "revisionHistoryLimit", "spec.revisionHistoryLimit");
    non_negative(e, at(spec, "ordinals"), "start", "spec.ordinals.start");
    let selector = workload_selector(e, spec, "statefulset");
    controller_template(e, spec, selector.as_ref(), "StatefulSet");
    if let Some(old) = old {
        // Only these may change; everything else in the spec is fixed at creation.
        let allowed = [
            "replicas",
            "ordinals",
            "template",
            "updateStrategy",
            "revisionHistoryLimit",
            "persistentVolumeClaimRetentionPolicy",
            "minReadySeconds",
        ];
        let rest = |v: &Value| -> Value {
            let mut m = strip_nulls(at(v, "spec"));
            if let Some(o) = m.as_object_mut() {
                for f in allowed {
                    o.remove(f);
                }
            }
            m
        };
        if rest(obj) != rest(old) {
            e.push(Cause::forbidden(
                "spec",
                "updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'revisionHistoryLimit', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden",
            ));
        }
    }
}

fn daemon_set(e: &mut Vec<Cause>, obj: &Value, old: Option<&Value>) {
    let spec = at(obj, "spec");
    let selector = workload_selector(e, spec, "daemonset");
    controller_template(e, spec, selector.as_ref(), "DaemonSet");
    non_negative(e, spec, "minReadySeconds", "spec.minReadySeconds");
    non_negative(e, spec, "revisionHistoryLimit", "spec.revisionHistoryLimit");
    let us = at(spec, "updateStrategy");
    match s(us, "type") {
        "OnDelete" => {}
        "RollingUpdate" => {
            let ru = at(us, "rollingUpdate");
            if ru.is_null() {
                e.push(Cause::required("spec.updateStrategy.rollingUpdate", ""));
            } else {
                let (unavailable, surge) = (at(ru, "maxUnavailable"), at(ru, "maxSurge"));
                positive_int_or_percent(
                    e,
                    unavailable,
                    "spec.updateStrategy.rollingUpdate.maxUnavailable",
                );
                positive_int_or_percent(e, surge, "spec.updateStrategy.rollingUpdate.maxSurge");
                if int_or_percent_value(unavailable).unwrap_or(0) == 0
                    && int_or_percent_value(surge).unwrap_or(0) == 0
                {
                    e.push(Cause::invalid(
                        "spec.updateStrategy.rollingUpdate.maxUnavailable",
                        unavailable,
                        "may not be 0 when `maxSurge` is 0",
                    ));
                }
            }
        }
        "" => e.push(Cause::required("spec.updateStrategy.type", "")),
        other => not_supported(
            e,
            "spec.updateStrategy.type",
            other,
            &["OnDelete", "RollingUpdate"],
        ),
    }
    immutable_selector(e, obj, old);
}

// ---- batch ----

/// `validateJobSpec` on a Job or a CronJob's job template (`path` is `spec` or
/// `spec.jobTemplate.spec`).
fn job_spec(e: &mut Vec<Cause>, spec: &Value, path: &str) {
    for field in [
        "parallelism",
        "completions",
        "activeDeadlineSeconds",
        "backoffLimit",
        "ttlSecondsAfterFinished",
    ] {
        non_negative(e, spec, field, &child(path, field));
    }
    if let Some(mode) = at(spec, "completionMode").as_str() {
        if mode != "NonIndexed" && mode != "Indexed" {
            not_supported(
                e,
                child(path, "completionMode"),
                mode,
                &["NonIndexed", "Indexed"],
            );
        }
        if mode == "Indexed" && !present(spec, "completions") {
            e.push(Cause::required(
                child(path, "completions"),
                "when completion mode is Indexed",
            ));
        }
    }
    optional_enum(
        e,
        spec,
        "podReplacementPolicy",
        &child(path, "podReplacementPolicy"),
        &["TerminatingOrFailed", "Failed"],
    );
    let template = at(spec, "template");
    let tpath = child(path, "template");
    pod_template(e, template, &tpath);
    let rp = s(at(template, "spec"), "restartPolicy");
    if rp != "OnFailure" && rp != "Never" {
        not_supported(
            e,
            child(&tpath, "spec.restartPolicy"),
            rp,
            &["OnFailure", "Never"],
        );
    }
}

fn job(e: &mut Vec<Cause>, obj: &Value, old: Option<&Value>) {
    let spec = at(obj, "spec");
    let sel = at(spec, "selector");
    let manual = at(spec, "manualSelector").as_bool() == Some(true);
    if sel.is_null() {
        // Without `manualSelector` the server generates the selector (defaults::job_selector).
        if manual {
            e.push(Cause::required("spec.selector", ""));
        }
    } else {
        label_selector(e, sel, "spec.selector");
        if let Ok(selector) = LabelSelector::from_label_selector_json(sel) {
            if !selector.matches_object(at(spec, "template")) {
                e.push(Cause::invalid(
                    "spec.template.metadata.labels",
                    at(at(at(spec, "template"), "metadata"), "labels"),
                    "`selector` does not match template `labels`",
                ));
            }
        }
    }
    job_spec(e, spec, "spec");
    let Some(old) = old else { return };
    let old_spec = at(old, "spec");
    immutable_selector(e, obj, Some(old));
    for field in ["completions", "completionMode"] {
        if !same(at(spec, field), at(old_spec, field)) {
            e.push(Cause::immutable(child("spec", field), at(spec, field)));
        }
    }
    // A suspended Job that never started may have its scheduling directives changed; otherwise
    // the template is fixed.
    let (mut new_t, mut old_t) = (
        strip_nulls(at(spec, "template")),
        strip_nulls(at(old_spec, "template")),
    );
    let never_started = at(at(old, "status"), "startTime").is_null();
    if at(old_spec, "suspend").as_bool() == Some(true) && never_started {
        for t in [&mut new_t, &mut old_t] {
            if let Some(m) = t.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("labels");
                m.remove("annotations");
            }
            if let Some(m) = t.get_mut("spec").and_then(Value::as_object_mut) {
                for f in ["nodeSelector", "tolerations", "affinity", "schedulingGates"] {
                    m.remove(f);
                }
            }
        }
    }
    if new_t != old_t {
        e.push(Cause::immutable("spec.template", at(spec, "template")));
    }
}

fn cron_job(e: &mut Vec<Cause>, obj: &Value, old: Option<&Value>) {
    let name = s(at(obj, "metadata"), "name");
    if name.len() > 52 {
        e.push(Cause::invalid(
            "metadata.name",
            &json!(name),
            "must be no more than 52 characters",
        ));
    }
    let spec = at(obj, "spec");
    let schedule = s(spec, "schedule");
    let old_schedule = old.map(|o| s(at(o, "spec"), "schedule")).unwrap_or("");
    if schedule.is_empty() {
        e.push(Cause::required("spec.schedule", ""));
    } else {
        if let Err(msg) = setpoint_api::cron::Schedule::parse(schedule) {
            e.push(Cause::invalid("spec.schedule", &json!(schedule), &msg));
        }
        let allow_tz = old_schedule.contains("TZ");
        if allow_tz && schedule.contains("TZ") && present(spec, "timeZone") {
            e.push(Cause::invalid(
                "spec.schedule",
                &json!(schedule),
                "cannot use both timeZone field and TZ or CRON_TZ in schedule",
            ));
        } else if !allow_tz && schedule.contains("TZ") {
            e.push(Cause::invalid(
                "spec.schedule",
                &json!(schedule),
                "cannot use TZ or CRON_TZ in schedule, use timeZone field instead",
            ));
        }
    }
    if let Some(tz) = at(spec, "timeZone").as_str() {
        time_zone(e, tz);
    }
    non_negative(
        e,
        spec,
        "startingDeadlineSeconds",
        "spec.startingDeadlineSeconds",
    );
    non_negative(
        e,
        spec,
        "successfulJobsHistoryLimit",
        "spec.successfulJobsHistoryLimit",
    );
    non_negative(
        e,
        spec,
        "failedJobsHistoryLimit",
        "spec.failedJobsHistoryLimit",
    );
    enum_field(
        e,
        s(spec, "concurrencyPolicy"),
        "spec.concurrencyPolicy",
        &["Allow", "Forbid", "Replace"],
    );
    let template = at(spec, "jobTemplate");
    let tspec = at(template, "spec");
    labels(
        e,
        at(at(template, "metadata"), "labels"),
        "spec.jobTemplate.labels",
    );
    annotations(
        e,
        at(at(template, "metadata"), "annotations"),
        "spec.jobTemplate.annotations",
    );
    job_spec(e, tspec, "spec.jobTemplate.spec");
    if present(tspec, "selector") {
        e.push(Cause::invalid(
            "spec.jobTemplate.spec.selector",
            at(tspec, "selector"),
            "`selector` will be auto-generated",
        ));
    }
    if at(tspec, "manualSelector").as_bool() == Some(true) {
        e.push(Cause::not_supported(
            "spec.jobTemplate.spec.manualSelector",
            &json!(true),
            &["nil", "false"],
        ));
    }
}

fn time_zone(e: &mut Vec<Cause>, tz: &str) {
    let path = "spec.timeZone";
    if tz.is_empty() {
        e.push(Cause::invalid(
            path,
            &json!(tz),
            "timeZone must be nil or non-empty string",
        ));
        return;
    }
    if !setpoint_api::cron::plausible_zone(tz) {
        e.push(Cause::invalid(
            path,
            &json!(tz),
            &format!("unknown time zone {tz}"),
        ));
    } else if tz.eq_ignore_ascii_case("local") {
        e.push(Cause::invalid(
            path,
            &json!(tz),
            "timeZone must be an explicit time zone as defined in https://www.iana.org/time-zones",
        ));
    }
}

// ---- services ----

fn service(e: &mut Vec<Cause>, obj: &Value, old: Option<&Value>) {
    let spec = at(obj, "spec");
    let ty = s(spec, "type");
    enum_field(
        e,
        ty,
        "spec.type",
        &["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"],
    );
    let ports = arr(spec, "ports");
    if ty == "ExternalName" {
        let ext = s(spec, "externalName");
        if ext.is_empty() {
            e.push(Cause::required("spec.externalName", ""));
        } else {
            dns_subdomain(e, ext.trim_end_matches('.'), "spec.externalName");
        }
    } else if ports.is_empty() {
        e.push(Cause::required("spec.ports", ""));
    }
    let mut port_names = HashSet::new();
    let mut port_keys = HashSet::new();
    for (i, port) in ports.iter().enumerate() {
        let p = index("spec.ports", i);
        let name = s(port, "name");
        if ports.len() > 1 && name.is_empty() {
            e.push(Cause::required(child(&p, "name"), ""));
        } else if !name.is_empty() {
            dns_label(e, name, &child(&p, "name"));
            if !port_names.insert(name.to_string()) {
                e.push(Cause::duplicate(child(&p, "name"), &json!(name)));
            }
        }
        let number = int(port, "port").unwrap_or(0);
        for msg in names::is_valid_port_num(number).err().unwrap_or_default() {
            e.push(Cause::invalid(child(&p, "port"), &json!(number), &msg));
        }
        let protocol = s(port, "protocol");
        enum_field(e, protocol, &child(&p, "protocol"), &["SCTP", "TCP", "UDP"]);
        match at(port, "targetPort") {
            Value::String(tp) => {
                for msg in names::is_valid_port_name(tp).err().unwrap_or_default() {
                    e.push(Cause::invalid(child(&p, "targetPort"), &json!(tp), &msg));
                }
            }
            Value::Null => {}
            other => {
                if let Some(n) = other.as_i64() {
                    for msg in names::is_valid_port_num(n).err().unwrap_or_default() {
                        e.push(Cause::invalid(child(&p, "targetPort"), other, &msg));
                    }
                }
            }
        }
        if let Some(np) = int(port, "nodePort").filter(|n| *n != 0) {
            if ty == "ClusterIP" || ty == "ExternalName" {
                e.push(Cause::forbidden(
                    child(&p, "nodePort"),
                    &format!("may not be used when `type` is '{ty}'"),
                ));
            } else {
                for msg in names::is_valid_port_num(np).err().unwrap_or_default() {
                    e.push(Cause::invalid(child(&p, "nodePort"), &json!(np), &msg));
                }
            }
        }
        if !port_keys.insert((number, protocol.to_string())) {
            e.push(Cause::duplicate(
                &p,
                &json!({"port": number, "protocol": protocol}),
            ));
        }
    }
    enum_field(
        e,
        s(spec, "sessionAffinity"),
        "spec.sessionAffinity",
        &["ClientIP", "None"],
    );
    labels(e, at(spec, "selector"), "spec.selector");
    let cluster_ip = s(spec, "clusterIP");
    if !cluster_ip.is_empty()
        && cluster_ip != "None"
        && cluster_ip.parse::<std::net::IpAddr>().is_err()
    {
        e.push(Cause::invalid(
            "spec.clusterIPs[0]",
            &json!(cluster_ip),
            "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
        ));
    }
    optional_enum(
        e,
        spec,
        "externalTrafficPolicy",
        "spec.externalTrafficPolicy",
        &["Cluster", "Local"],
    );
    optional_enum(
        e,
        spec,
        "internalTrafficPolicy",
        "spec.internalTrafficPolicy",
        &["Cluster", "Local"],
    );
    optional_enum(
        e,
        spec,
        "ipFamilyPolicy",
        "spec.ipFamilyPolicy",
        &["SingleStack", "PreferDualStack", "RequireDualStack"],
    );
    for (i, fam) in arr(spec, "ipFamilies").iter().enumerate() {
        let fam = fam.as_str().unwrap_or("");
        if fam != "IPv4" && fam != "IPv6" {
            not_supported(e, index("spec.ipFamilies", i), fam, &["IPv4", "IPv6"]);
        }
    }
    if let Some(old) = old {
        let old_spec = at(old, "spec");
        let old_ip = s(old_spec, "clusterIP");
        let external = ty == "ExternalName" || s(old_spec, "type") == "ExternalName";
        if !external && !old_ip.is_empty() && !cluster_ip.is_empty() && old_ip != cluster_ip {
            e.push(Cause::invalid(
                "spec.clusterIPs[0]",
                &json!([cluster_ip]),
                "may not change once set",
            ));
        }
    }
}

// ---- config ----

fn config_key(e: &mut Vec<Cause>, k: &str, path: &str) {
    for msg in names::is_config_map_key(k).err().unwrap_or_default() {
        e.push(Cause::invalid(key(path, k), &json!(k), &msg));
    }
}

/// The decoded length of base64 data, or the error Go's decoder reports.
fn base64_len(v: &Value) -> Result<usize, String> {
    use base64::Engine;
    if v.is_null() {
        // A null byte field decodes to no bytes.
        return Ok(0);
    }
    let Some(text) = v.as_str() else {
        return Err("must be a base64-encoded string".into());
    };
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map(|b| b.len())
        .map_err(|err| match err {
            base64::DecodeError::InvalidByte(at, _)
            | base64::DecodeError::InvalidLastSymbol(at, _) => {
                format!("illegal base64 data at input byte {at}")
            }
            _ => format!("illegal base64 data at input byte {}", text.len()),
        })
}

fn config_map(e: &mut Vec<Cause>, obj: &Value, old: Option<&Value>) {
    let (data, binary) = (at(obj, "data"), at(obj, "binaryData"));
    let mut total = 0;
    for (k, v) in entries(data) {
        config_key(e, k, "data");
        if binary.get(k.as_str()).is_some() {
            e.push(Cause::invalid(
                key("data", k),
                &json!(k),
                "duplicate of key present in binaryData",
            ));
        }
        total += v.as_str().map_or(0, str::len);
    }
    for (k, v) in entries(binary) {
        config_key(e, k, "binaryData");
        match base64_len(v) {
            Ok(n) => total += n,
            Err(msg) => e.push(Cause::invalid(
                key("binaryData", k),
                &json!("<binary data>"),
                &msg,
            )),
        }
    }
    if total > MAX_SECRET_SIZE {
        e.push(Cause::too_long("", MAX_SECRET_SIZE));
    }
    if let Some(old) = old {
        immutable_contents(e, obj, old, &["data", "binaryData"]);
    }
}

/// Once `immutable: true` is stored, it stays and the contents cannot change.
fn immutable_contents(e: &mut Vec<Cause>, obj: &Value, old: &Value, fields: &[&str]) {
    if at(old, "immutable").as_bool() != Some(true) {
        return;
    }
    if at(obj, "immutable").as_bool() != Some(true) {
        e.push(Cause::forbidden(
            "immutable",
            "field is immutable when `immutable` is set",
        ));
    }
    for f in fields {
        if !same(at(obj, f), at(old, f)) {
            e.push(Cause::forbidden(
                *f,
                "field is immutable when `immutable` is set",
            ));
        }
    }
}

fn secret(e: &mut Vec<Cause>, obj: &Value, old: Option<&Value>) {
    let data = at(obj, "data");
    let mut total = 0;
    for (k, v) in entries(data) {
        config_key(e, k, "data");
        match base64_len(v) {
            Ok(n) => total += n,
            Err(msg) => e.push(Cause::invalid(
                key("data", k),
                &json!("<secret contents redacted>"),
                &msg,
            )),
        }
    }
    if total > MAX_SECRET_SIZE {
        e.push(Cause::too_long("data", MAX_SECRET_SIZE));
    }
    for (k, _) in entries(at(obj, "stringData")) {
        config_key(e, k, "stringData");
    }
    let has = |k: &str| data.get(k).is_some();
    let sa_name = s(
        at(at(obj, "metadata"), "annotations"),
        "kubernetes.io/service-account.name",
    );
    match s(obj, "type") {
        "kubernetes.io/service-account-token" if sa_name.is_empty() => {
            e.push(Cause::required(
                "metadata.annotations[kubernetes.io/service-account.name]",
                "",
            ));
        }
        "kubernetes.io/dockercfg" => docker_config(e, data, ".dockercfg"),
        "kubernetes.io/dockerconfigjson" => docker_config(e, data, ".dockerconfigjson"),
        "kubernetes.io/basic-auth" if !has("username") && !has("password") => {
            e.push(Cause::required("data[username]", ""));
            e.push(Cause::required("data[password]", ""));
        }
        "kubernetes.io/ssh-auth" if base64_len(at(data, "ssh-privatekey")).unwrap_or(0) == 0 => {
            e.push(Cause::required("data[ssh-privatekey]", ""));
        }
        "kubernetes.io/tls" => {
            for k in ["tls.crt", "tls.key"] {
                if !has(k) {
                    e.push(Cause::required(key("data", k), ""));
                }
            }
        }
        _ => {}
    }
    if let Some(old) = old {
        if s(obj, "type") != s(old, "type") {
            e.push(Cause::immutable("type", at(obj, "type")));
        }
        immutable_contents(e, obj, old, &["data"]);
    }
}

fn docker_config(e: &mut Vec<Cause>, data: &Value, k: &str) {
    use base64::Engine;
    let path = key("data", k);
    let Some(encoded) = at(data, k).as_str() else {
        e.push(Cause::required(path, ""));
        return;
    };
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .unwrap_or_default();
    if let Err(err) = serde_json::from_slice::<Map<String, Value>>(&decoded) {
        e.push(Cause::invalid(
            path,
            &json!("<secret contents redacted>"),
            &err.to_string(),
        ));
    }
}

// ---- autoscaling ----

fn hpa(e: &mut Vec<Cause>, obj: &Value) {
    let spec = at(obj, "spec");
    let target = at(spec, "scaleTargetRef");
    if s(target, "kind").is_empty() {
        e.push(Cause::required("spec.scaleTargetRef.kind", ""));
    }
    let name = s(target, "name");
    if name.is_empty() {
        e.push(Cause::required("spec.scaleTargetRef.name", ""));
    } else {
        for msg in names::path_segment_name(name).err().unwrap_or_default() {
            e.push(Cause::invalid(
                "spec.scaleTargetRef.name",
                &json!(name),
                &msg,
            ));
        }
    }
    let min = int(spec, "minReplicas");
    if let Some(m) = min.filter(|m| *m < 1) {
        e.push(Cause::invalid(
            "spec.minReplicas",
            &json!(m),
            "must be greater than or equal to 1",
        ));
    }
    match int(spec, "maxReplicas") {
        Some(max) if max < 1 => e.push(Cause::invalid(
            "spec.maxReplicas",
            &json!(max),
            "must be greater than 0",
        )),
        Some(max) if min.is_some_and(|m| max < m) => e.push(Cause::invalid(
            "spec.maxReplicas",
            &json!(max),
            "must be greater than or equal to `minReplicas`",
        )),
        _ => {}
    }
}

// ---- typed decoding ----

mod typed {
    use super::*;
    use k8s_openapi::api;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiextensions;

    /// Decodes into a typed object: `value` straight from a `Value`, noting the keys the
    /// decoder passes over (the fast path, for valid objects); `text` from rendered text whose
    /// line numbers locate an error, encoding the result back to JSON (the slow path, only when
    /// the fast one failed).
    #[derive(Clone, Copy)]
    pub struct DecodeFn {
        value: fn(&Value) -> Result<Vec<Vec<Seg>>, serde_json::Error>,
        text: fn(&str) -> Result<Value, serde_json::Error>,
        fits: fn(&Value) -> bool,
        /// Whether a `status` value decodes as the kind's status type; `None` for kinds
        /// without one.
        status: Option<fn(&Value) -> bool>,
    }

    impl DecodeFn {
        fn of<T: DeserializeOwned + Serialize>() -> Self {
            DecodeFn {
                value: passed_over::<T>,
                text: round_trip::<T>,
                fits: |v| T::deserialize(v).is_ok(),
                status: None,
            }
        }

        /// A kind whose `status` has type `S`.
        fn with_status<S: DeserializeOwned>(self) -> Self {
            DecodeFn {
                status: Some(|v| S::deserialize(v).is_ok()),
                ..self
            }
        }

        /// Whether `obj` decodes as the type as it is (apiVersion and kind included).
        pub fn fits(&self, obj: &Value) -> bool {
            (self.fits)(obj)
        }

        /// Whether `obj`'s `status` decodes as the kind's status type (absent or `null` does);
        /// false for a kind without one.
        pub fn status_fits(&self, obj: &Value) -> bool {
            match (self.status, obj.get("status")) {
                (None, _) => false,
                (Some(_), None | Some(Value::Null)) => true,
                (Some(fits), Some(status)) => fits(status),
            }
        }
    }

    fn round_trip<T: DeserializeOwned + Serialize>(text: &str) -> Result<Value, serde_json::Error> {
        let typed: T = serde_json::from_str(text)?;
        serde_json::to_value(&typed)
    }

    /// Decodes `v` as `T` and returns the paths of the keys `T` does not know, which its
    /// decoder skips.
    fn passed_over<T: DeserializeOwned>(v: &Value) -> Result<Vec<Vec<Seg>>, serde_json::Error> {
        let mut skipped = Vec::new();
        let _: T = serde_ignored::deserialize(v, |path| skipped.push(segments(&path)))?;
        Ok(skipped)
    }

    fn segments(path: &serde_ignored::Path) -> Vec<Seg> {
        let mut out = Vec::new();
        let mut at = path;
        loop {
            at = match at {
                serde_ignored::Path::Root => break,
                serde_ignored::Path::Seq { parent, index } => {
                    out.push(Seg::Index(*index));
                    parent
                }
                serde_ignored::Path::Map { parent, key } => {
                    out.push(Seg::Key(key.clone()));
                    parent
                }
                serde_ignored::Path::Some { parent }
                | serde_ignored::Path::NewtypeStruct { parent }
                | serde_ignored::Path::NewtypeVariant { parent } => parent,
            };
        }
        out.reverse();
        out
    }

    /// The typed schema for a group/version/kind, if k8s-openapi has it.
    pub fn decoder(group: &str, version: &str, kind: &str) -> Option<DecodeFn> {
        use api::*;
        let f: DecodeFn = match (group, version, kind) {
            ("", "v1", "Pod") => {
                DecodeFn::of::<core::v1::Pod>().with_status::<core::v1::PodStatus>()
            }
            ("", "v1", "Service") => {
                DecodeFn::of::<core::v1::Service>().with_status::<core::v1::ServiceStatus>()
            }
            ("", "v1", "ReplicationController") => {
                DecodeFn::of::<core::v1::ReplicationController>()
                    .with_status::<core::v1::ReplicationControllerStatus>()
            }
            ("", "v1", "Namespace") => {
                DecodeFn::of::<core::v1::Namespace>().with_status::<core::v1::NamespaceStatus>()
            }
            ("", "v1", "Node") => {
                DecodeFn::of::<core::v1::Node>().with_status::<core::v1::NodeStatus>()
            }
            ("", "v1", "Endpoints") => DecodeFn::of::<core::v1::Endpoints>(),
            ("", "v1", "ConfigMap") => DecodeFn::of::<core::v1::ConfigMap>(),
            ("", "v1", "Secret") => DecodeFn::of::<core::v1::Secret>(),
            ("", "v1", "ServiceAccount") => DecodeFn::of::<core::v1::ServiceAccount>(),
            ("", "v1", "Event") => DecodeFn::of::<core::v1::Event>(),
            ("", "v1", "ResourceQuota") => DecodeFn::of::<core::v1::ResourceQuota>()
                .with_status::<core::v1::ResourceQuotaStatus>(),
            ("", "v1", "LimitRange") => DecodeFn::of::<core::v1::LimitRange>(),
            ("", "v1", "PodTemplate") => DecodeFn::of::<core::v1::PodTemplate>(),
            ("", "v1", "PersistentVolumeClaim") => {
                DecodeFn::of::<core::v1::PersistentVolumeClaim>()
                    .with_status::<core::v1::PersistentVolumeClaimStatus>()
            }
            ("", "v1", "PersistentVolume") => DecodeFn::of::<core::v1::PersistentVolume>()
                .with_status::<core::v1::PersistentVolumeStatus>(),
            ("", "v1", "Binding") => DecodeFn::of::<core::v1::Binding>(),
            ("apps", "v1", "Deployment") => {
                DecodeFn::of::<apps::v1::Deployment>().with_status::<apps::v1::DeploymentStatus>()
            }
            ("apps", "v1", "ReplicaSet") => {
                DecodeFn::of::<apps::v1::ReplicaSet>().with_status::<apps::v1::ReplicaSetStatus>()
            }
            ("apps", "v1", "StatefulSet") => {
                DecodeFn::of::<apps::v1::StatefulSet>().with_status::<apps::v1::StatefulSetStatus>()
            }
            ("apps", "v1", "DaemonSet") => {
                DecodeFn::of::<apps::v1::DaemonSet>().with_status::<apps::v1::DaemonSetStatus>()
            }
            ("apps", "v1", "ControllerRevision") => DecodeFn::of::<apps::v1::ControllerRevision>(),
            ("batch", "v1", "Job") => {
                DecodeFn::of::<batch::v1::Job>().with_status::<batch::v1::JobStatus>()
            }
            ("batch", "v1", "CronJob") => {
                DecodeFn::of::<batch::v1::CronJob>().with_status::<batch::v1::CronJobStatus>()
            }
            ("autoscaling", "v2", "HorizontalPodAutoscaler") => {
                DecodeFn::of::<autoscaling::v2::HorizontalPodAutoscaler>()
                    .with_status::<autoscaling::v2::HorizontalPodAutoscalerStatus>()
            }
            ("autoscaling", "v1", "HorizontalPodAutoscaler") => {
                DecodeFn::of::<autoscaling::v1::HorizontalPodAutoscaler>()
                    .with_status::<autoscaling::v1::HorizontalPodAutoscalerStatus>()
            }
            ("autoscaling", "v1", "Scale") => DecodeFn::of::<autoscaling::v1::Scale>(),
            ("coordination.k8s.io", "v1", "Lease") => DecodeFn::of::<coordination::v1::Lease>(),
            ("events.k8s.io", "v1", "Event") => DecodeFn::of::<events::v1::Event>(),
            ("policy", "v1", "Eviction") => DecodeFn::of::<policy::v1::Eviction>(),
            ("policy", "v1", "PodDisruptionBudget") => {
                DecodeFn::of::<policy::v1::PodDisruptionBudget>()
                    .with_status::<policy::v1::PodDisruptionBudgetStatus>()
            }
            ("apiextensions.k8s.io", "v1", "CustomResourceDefinition") => {
                DecodeFn::of::<apiextensions::CustomResourceDefinition>()
                    .with_status::<apiextensions::CustomResourceDefinitionStatus>()
            }
            _ => return None,
        };
        Some(f)
    }

    /// One step of a JSON path.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub enum Seg {
        Key(String),
        Index(usize),
    }

    pub fn path_string(path: &[Seg]) -> String {
        let mut out = String::new();
        for seg in path {
            match seg {
                Seg::Key(k) => {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(k);
                }
                Seg::Index(i) => out.push_str(&format!("[{i}]")),
            }
        }
        out
    }

    /// JSON text with one member or element per line, and the path each line holds.
    pub fn render(v: &Value) -> (String, Vec<Vec<Seg>>) {
        let mut lines: Vec<(String, Vec<Seg>)> = Vec::new();
        emit(v, "", &mut Vec::new(), &mut lines);
        let text = lines
            .iter()
            .map(|(l, _)| l.as_str())
            .collect::<Vec<_>>()
            .join("\n");
        (text, lines.into_iter().map(|(_, p)| p).collect())
    }

    fn emit(v: &Value, prefix: &str, path: &mut Vec<Seg>, lines: &mut Vec<(String, Vec<Seg>)>) {
        match v {
            Value::Object(m) => {
                lines.push((format!("{prefix}{{"), path.clone()));
                for (i, (k, child)) in m.iter().enumerate() {
                    path.push(Seg::Key(k.clone()));
                    let key_text = Value::String(k.clone()).to_string();
                    emit(child, &format!("{key_text}: "), path, lines);
                    path.pop();
                    if i + 1 < m.len() {
                        if let Some(last) = lines.last_mut() {
                            last.0.push(',');
                        }
                    }
                }
                lines.push(("}".into(), path.clone()));
            }
            Value::Array(a) => {
                lines.push((format!("{prefix}["), path.clone()));
                for (i, child) in a.iter().enumerate() {
                    path.push(Seg::Index(i));
                    emit(child, "", path, lines);
                    path.pop();
                    if i + 1 < a.len() {
                        if let Some(last) = lines.last_mut() {
                            last.0.push(',');
                        }
                    }
                }
                lines.push(("]".into(), path.clone()));
            }
            scalar => lines.push((format!("{prefix}{scalar}"), path.clone())),
        }
    }

    fn lookup<'a>(v: &'a Value, path: &[Seg]) -> Option<&'a Value> {
        path.iter().try_fold(v, |cur, seg| match seg {
            Seg::Key(k) => cur.get(k.as_str()),
            Seg::Index(i) => cur.get(*i),
        })
    }

    /// Removes the value at `path` so decoding can go on; a bad array element takes its whole
    /// array with it (removing one element would renumber the rest). Returns what was removed.
    fn remove(v: &mut Value, path: &[Seg]) -> Option<Vec<Seg>> {
        let cut = path.iter().rposition(|s| matches!(s, Seg::Key(_)))?;
        let (parent, last) = (&path[..cut], &path[cut]);
        let Seg::Key(k) = last else { return None };
        let mut cur = v;
        for seg in parent {
            cur = match seg {
                Seg::Key(k) => cur.get_mut(k.as_str())?,
                Seg::Index(i) => cur.get_mut(*i)?,
            };
        }
        cur.as_object_mut()?.remove(k.as_str())?;
        Some(path[..=cut].to_vec())
    }

    /// Makes serde's wording about Rust types read in API terms.
    fn detail(err: &serde_json::Error) -> String {
        let text = err.to_string();
        let text = match text.rfind(" at line ") {
            Some(i) => text[..i].to_string(),
            None => text,
        };
        let mut out = text;
        for (rust, api) in [
            ("expected i32", "expected int32"),
            ("expected i64", "expected int64"),
            ("expected u32", "expected int32"),
            ("expected u64", "expected int64"),
            ("expected f64", "expected a number"),
            ("expected a sequence", "expected an array"),
            ("expected a map", "expected an object"),
        ] {
            if let Some(rest) = out.strip_suffix(rust) {
                out = format!("{rest}{api}");
            }
        }
        out
    }

    pub struct Decoded {
        pub errors: Vec<Cause>,
        /// Paths of the non-null fields the type does not know (none when the object could not
        /// be decoded at all).
        pub unknown: Vec<String>,
        /// Where the fields the type does not know are, `null` ones included.
        pub unknown_at: Vec<Vec<Seg>>,
    }

    pub fn decode(f: DecodeFn, obj: &Value) -> Decoded {
        // Fast path: a valid object decodes in one pass without rendering text. The typed
        // decoders insist on their own apiVersion/kind, so only take it when those are absent
        // or decode fine; any failure goes to the careful path below.
        if let Ok(skipped) = (f.value)(obj) {
            return Decoded {
                errors: Vec::new(),
                unknown: skipped
                    .iter()
                    .filter(|p| lookup(obj, p).is_some_and(|v| !v.is_null()))
                    .map(|p| path_string(p))
                    .collect(),
                unknown_at: skipped,
            };
        }
        let mut work = obj.clone();
        // The typed decoders insist on their own apiVersion/kind; the server has already
        // routed the request, so those two are not this check's business.
        if let Some(m) = work.as_object_mut() {
            m.remove("apiVersion");
            m.remove("kind");
        }
        let mut errors = Vec::new();
        let mut dropped = Vec::new();
        for _ in 0..64 {
            let (text, lines) = render(&work);
            let err = match (f.text)(&text) {
                Ok(round_trip) => {
                    // Keys of the original that did not survive the round trip are unknown.
                    let mut unknown = Vec::new();
                    let mut at = Vec::new();
                    unknown_at(
                        obj,
                        &round_trip,
                        &mut Vec::new(),
                        &dropped,
                        &mut unknown,
                        &mut at,
                    );
                    return Decoded {
                        errors,
                        unknown,
                        unknown_at: at,
                    };
                }
                Err(err) => err,
            };
            let mut path = err
                .line()
                .checked_sub(1)
                .and_then(|l| lines.get(l))
                .cloned()
                .unwrap_or_default();
            // A struct given an array (or a list given a map) is reported after its opening
            // bracket, on the first member's line: blame the container instead.
            let message = err.to_string();
            let (want_seq, want_map) = (
                message.contains("invalid type: sequence"),
                message.contains("invalid type: map"),
            );
            if want_seq || want_map {
                loop {
                    let v = lookup(&work, &path);
                    let fits = (want_seq && v.is_some_and(Value::is_array))
                        || (want_map && v.is_some_and(Value::is_object));
                    if fits || path.pop().is_none() {
                        break;
                    }
                }
            }
            let bad = lookup(&work, &path).cloned().unwrap_or(Value::Null);
            errors.push(Cause::invalid(path_string(&path), &bad, &detail(&err)));
            match remove(&mut work, &path) {
                Some(removed) => dropped.push(path_string(&removed)),
                None => break,
            }
        }
        Decoded {
            errors,
            unknown: Vec::new(),
            unknown_at: Vec::new(),
        }
    }

    /// The unknown fields of a valid `obj` found the slow path's way: keys of the original
    /// missing from its typed round trip (the reference the fast path is tested against).
    #[cfg(test)]
    pub fn unknown_by_round_trip<T: DeserializeOwned + Serialize>(obj: &Value) -> Vec<String> {
        let round_trip = serde_json::to_value(T::deserialize(obj).expect("valid")).unwrap();
        let mut out = Vec::new();
        unknown_at(
            obj,
            &round_trip,
            &mut Vec::new(),
            &[],
            &mut out,
            &mut Vec::new(),
        );
        out
    }

    /// Collects keys of `orig` missing from `typed` (the typed round trip), as path strings
    /// (`out`) and as paths (`at`), with one path buffer for the whole walk (a path is copied
    /// only when it is reported). `null` values set nothing and are not reported.
    fn unknown_at(
        orig: &Value,
        typed: &Value,
        path: &mut Vec<Seg>,
        dropped: &[String],
        out: &mut Vec<String>,
        at: &mut Vec<Vec<Seg>>,
    ) {
        match (orig, typed) {
            (Value::Object(o), Value::Object(t)) => {
                for (k, v) in o {
                    path.push(Seg::Key(k.clone()));
                    let was_dropped =
                        !dropped.is_empty() && dropped.iter().any(|d| *d == path_string(path));
                    if !v.is_null() && !was_dropped {
                        match t.get(k) {
                            None => {
                                out.push(path_string(path));
                                at.push(path.clone());
                            }
                            Some(tv) => unknown_at(v, tv, path, dropped, out, at),
                        }
                    }
                    path.pop();
                }
            }
            (Value::Array(o), Value::Array(t)) => {
                for (i, (v, tv)) in o.iter().zip(t).enumerate() {
                    path.push(Seg::Index(i));
                    unknown_at(v, tv, path, dropped, out, at);
                    path.pop();
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::defaults;

    fn small_json() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            (0i64..3).prop_map(Value::from),
            proptest::sample::select(vec!["a", "b"]).prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::from),
                proptest::collection::btree_map(
                    proptest::sample::select(vec!["x", "y", "z"]),
                    inner,
                    0..3
                )
                .prop_map(|m| Value::Object(
                    m.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
                )),
            ]
        })
    }

    proptest::proptest! {
        /// Comparing in place agrees with comparing copies stripped of `null` members.
        #[test]
        fn same_agrees_with_comparing_stripped_copies(a in small_json(), b in small_json()) {
            proptest::prop_assert_eq!(same(&a, &b), strip_nulls(&a) == strip_nulls(&b));
            proptest::prop_assert!(same(&a, &strip_nulls(&a)));
        }
    }

    /// Defaults then validates, as the server does on create.
    fn check(group: &str, version: &str, kind: &str, mut obj: Value) -> Vec<Cause> {
        defaults::apply(group, kind, &mut obj);
        validate(group, version, kind, &obj, None)
    }

    fn check_update(
        group: &str,
        version: &str,
        kind: &str,
        mut old: Value,
        mut new: Value,
    ) -> Vec<Cause> {
        defaults::apply(group, kind, &mut old);
        defaults::apply(group, kind, &mut new);
        validate(group, version, kind, &new, Some(&old))
    }

    fn fields(causes: &[Cause]) -> Vec<&str> {
        causes.iter().map(|c| c.field.as_str()).collect()
    }

    fn find<'a>(causes: &'a [Cause], field: &str) -> &'a Cause {
        causes
            .iter()
            .find(|c| c.field == field)
            .unwrap_or_else(|| panic!("no cause on {field}: {causes:?}"))
    }

    fn deployment() -> Value {
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}, "creationTimestamp": null},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "web"}},
                "strategy": {},
                "template": {
                    "metadata": {"labels": {"app": "web"}, "creationTimestamp": null},
                    "spec": {"containers": [{
                        "name": "nginx",
                        "image": "nginx:1.25",
                        "ports": [{"containerPort": 80, "name": "http"}],
                        "resources": {"limits": {"cpu": "1", "memory": "128Mi"}, "requests": {"cpu": 0.5}},
                        "readinessProbe": {"httpGet": {"port": "http", "path": "/"}},
                        "env": [{"name": "A", "value": "b"}],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}]
                    }], "volumes": [{"name": "data", "emptyDir": {}}]}
                }
            },
            "status": {}
        })
    }

    fn pod() -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p1", "namespace": "default"},
            "spec": {"containers": [{"name": "main", "image": "busybox:1.36", "ports": [{"containerPort": 8080}]}]},
            "status": {}
        })
    }

    #[test]
    fn valid_deployment_has_no_causes_or_unknown_fields() {
        assert_eq!(check("apps", "v1", "Deployment", deployment()), vec![]);
        assert_eq!(
            unknown_fields("apps", "v1", "Deployment", &deployment()),
            Vec::<String>::new()
        );
        let mut d = deployment();
        defaults::apply("apps", "Deployment", &mut d);
        assert_eq!(
            unknown_fields("apps", "v1", "Deployment", &d),
            Vec::<String>::new()
        );
    }

    #[test]
    fn selector_must_match_template() {
        let mut d = deployment();
        d["spec"]["template"]["metadata"]["labels"] = json!({"app": "other"});
        let causes = check("apps", "v1", "Deployment", d);
        let c = find(&causes, "spec.template.metadata.labels");
        assert_eq!(c.reason, "FieldValueInvalid");
        assert!(
            c.message
                .ends_with("`selector` does not match template `labels`"),
            "{}",
            c.message
        );
    }

    #[test]
    fn selector_required_and_not_empty() {
        let mut d = deployment();
        d["spec"].as_object_mut().unwrap().remove("selector");
        let causes = check("apps", "v1", "Deployment", d);
        assert_eq!(find(&causes, "spec.selector").message, "Required value");
        let mut d = deployment();
        d["spec"]["selector"] = json!({});
        let causes = check("apps", "v1", "Deployment", d);
        assert!(find(&causes, "spec.selector")
            .message
            .ends_with("empty selector is invalid for deployment"));
    }

    #[test]
    fn negative_replicas() {
        let mut d = deployment();
        d["spec"]["replicas"] = json!(-1);
        let causes = check("apps", "v1", "Deployment", d);
        assert_eq!(
            find(&causes, "spec.replicas").message,
            "Invalid value: -1: must be greater than or equal to 0"
        );
    }

    #[test]
    fn type_errors_name_their_fields() {
        let mut d = deployment();
        d["spec"]["replicas"] = json!("3");
        d["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = json!("80");
        d["spec"]["paused"] = json!("yes");
        let causes = check("apps", "v1", "Deployment", d.clone());
        let c = find(&causes, "spec.replicas");
        assert_eq!(
            c.message,
            "Invalid value: \"3\": invalid type: string \"3\", expected int32"
        );
        find(
            &causes,
            "spec.template.spec.containers[0].ports[0].containerPort",
        );
        find(&causes, "spec.paused");
        // A bad value is a type error, not an unknown field.
        assert_eq!(
            unknown_fields("apps", "v1", "Deployment", &d),
            Vec::<String>::new()
        );
    }

    #[test]
    fn wrong_container_types_blame_the_container() {
        let mut d = deployment();
        d["spec"]["selector"] = json!([{"matchLabels": {"app": "web"}}]);
        d["spec"]["template"]["spec"]["containers"] = json!({"name": "a", "image": "b"});
        let causes = check("apps", "v1", "Deployment", d);
        assert_eq!(
            fields(&causes),
            vec!["spec.selector", "spec.template.spec.containers"],
            "{causes:?}"
        );
        assert!(causes[0].message.contains("invalid type: sequence"));
        let causes = validate("", "v1", "Pod", &json!([1, 2]), None);
        assert_eq!(causes[0].field, "");
    }

    #[test]
    fn status_writes_decode_only_the_status() {
        let mut p = pod();
        p["status"] = json!({"phase": "Running", "podIP": "10.0.0.1"});
        assert!(status_type_errors("", "v1", "Pod", &p).is_empty());
        p.as_object_mut().unwrap().remove("status");
        assert!(status_type_errors("", "v1", "Pod", &p).is_empty());
        // A wrong status is reported with its path, by the whole decode.
        p["status"] = json!({"phase": "Running", "containerStatuses": {"name": "a"}});
        let causes = status_type_errors("", "v1", "Pod", &p);
        find(&causes, "status.containerStatuses");
        p["status"] = json!(["Running"]);
        find(&status_type_errors("", "v1", "Pod", &p), "status");
        // What a status write copies from the stored object is not decoded again.
        p["status"] = json!({"phase": "Running"});
        p["spec"]["containers"][0]["args"] = json!(["ok", 5]);
        assert!(status_type_errors("", "v1", "Pod", &p).is_empty());
        assert!(!type_errors("", "v1", "Pod", &p).is_empty());
        // Kinds without a typed status are decoded whole.
        let mut cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "d"}, "data": {"k": 5}});
        find(&status_type_errors("", "v1", "ConfigMap", &cm), "data.k");
        cm["data"] = json!({"k": "v"});
        assert!(status_type_errors("", "v1", "ConfigMap", &cm).is_empty());
    }

    #[test]
    fn type_error_in_array_element() {
        let mut p = pod();
        p["spec"]["containers"][0]["args"] = json!(["ok", 5]);
        p["spec"]["containers"][0]["imagee"] = json!("typo");
        let causes = check("", "v1", "Pod", p.clone());
        let c = find(&causes, "spec.containers[0].args[1]");
        assert!(c.message.contains("expected a string"), "{}", c.message);
        assert_eq!(
            unknown_fields("", "v1", "Pod", &p),
            vec!["spec.containers[0].imagee".to_string()]
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

        /// The keys the decoder passes over are the keys the round trip loses, wherever
        /// unknown keys (with any values, null included) are put.
        #[test]
        fn passed_over_keys_are_the_keys_a_round_trip_loses(
            extra in proptest::collection::vec(
                (0..8usize, proptest::sample::select(vec!["foo", "imagee", "name", "x.y"]), small_json()),
                0..6,
            )
        ) {
            use k8s_openapi::api::apps::v1::Deployment;
            use serde::Deserialize;
            let mut d = deployment();
            let places = [
                "", "/metadata", "/spec", "/spec/strategy", "/spec/template/metadata",
                "/spec/template/spec/containers/0", "/spec/template/spec/volumes/0/emptyDir",
                "/spec/template/spec/containers/0/ports/0",
            ];
            for (at, key, value) in extra {
                if let Some(obj) = d.pointer_mut(places[at]).and_then(Value::as_object_mut) {
                    // A known key keeps a value of its own type, so the object stays valid.
                    if !obj.contains_key(key) {
                        obj.insert(key.to_string(), value);
                    }
                }
            }
            if Deployment::deserialize(&d).is_err() {
                return Ok(());
            }
            proptest::prop_assert_eq!(
                unknown_fields("apps", "v1", "Deployment", &d),
                typed::unknown_by_round_trip::<Deployment>(&d)
            );
        }
    }

    #[test]
    fn unknown_fields_at_several_depths() {
        let mut d = deployment();
        d["spec"]["foo"] = json!(1);
        d["spec"]["template"]["spec"]["containers"][0]["imagee"] = json!("nginx");
        d["spec"]["template"]["metadata"]["lables"] = json!({"a": "b"});
        d["metadata"]["labelz"] = json!({});
        d["spec"]["strategy"]["rollingUpdate"] = json!({"maxSurge": 1, "maxSurgee": 2});
        d["spec"]["template"]["spec"]["volumes"][0]["emptyDir"]["sizelimit"] = json!("1Gi");
        d["topLevel"] = json!([]);
        d["spec"]["ignored"] = Value::Null;
        let mut got = unknown_fields("apps", "v1", "Deployment", &d);
        got.sort();
        assert_eq!(
            got,
            vec![
                "metadata.labelz",
                "spec.foo",
                "spec.strategy.rollingUpdate.maxSurgee",
                "spec.template.metadata.lables",
                "spec.template.spec.containers[0].imagee",
                "spec.template.spec.volumes[0].emptyDir.sizelimit",
                "topLevel",
            ]
        );
        assert!(unknown_fields("example.com", "v1", "Widget", &d).is_empty());
    }

    #[test]
    fn empty_objects_and_lists_are_known() {
        let p = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "labels": {}, "annotations": {}, "finalizers": [], "ownerReferences": []},
            "spec": {"containers": [{"name": "a", "image": "b", "resources": {}, "env": [], "securityContext": {}, "args": []}],
                     "securityContext": {}, "tolerations": [], "volumes": [], "affinity": {}},
            "status": {"conditions": [], "containerStatuses": []}
        });
        assert_eq!(unknown_fields("", "v1", "Pod", &p), Vec::<String>::new());
    }

    #[test]
    fn kopf_event_timestamps_decode() {
        let ev = json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": "kopf-event-", "namespace": "default"},
            "action": "Action", "reason": "Logging", "type": "Normal", "message": "hi",
            "reportingComponent": "kopf", "reportingInstance": "dev", "source": {"component": "kopf"},
            "firstTimestamp": "2026-11-22T01:19:32.636911+00:00",
            "lastTimestamp": "2026-11-22T01:19:32.636911+00:00",
            "eventTime": "2026-11-22T01:19:32.636911+00:00",
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u", "namespace": "default"}
        });
        assert_eq!(validate("", "v1", "Event", &ev, None), vec![]);
        assert!(unknown_fields("", "v1", "Event", &ev).is_empty());
    }

    #[test]
    fn object_names() {
        let mut d = deployment();
        d["metadata"]["name"] = json!("Bad_Name");
        let causes = check("apps", "v1", "Deployment", d);
        let c = find(&causes, "metadata.name");
        assert!(
            c.message
                .starts_with("Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain"),
            "{}",
            c.message
        );
        let ns = check("", "v1", "Namespace", json!({"metadata": {"name": "a.b"}}));
        assert_eq!(
            find(&ns, "metadata.name").message,
            "Invalid value: \"a.b\": must not contain dots"
        );
        let svc = check(
            "",
            "v1",
            "Service",
            json!({"metadata": {"name": "1svc"}, "spec": {"ports": [{"port": 80}]}}),
        );
        assert!(find(&svc, "metadata.name")
            .message
            .contains("a DNS-1035 label"));
        let missing = check("", "v1", "ConfigMap", json!({"metadata": {}}));
        assert_eq!(
            find(&missing, "metadata.name").message,
            "Required value: name or generateName is required"
        );
        assert_eq!(
            check(
                "",
                "v1",
                "ConfigMap",
                json!({"metadata": {"generateName": "cfg-"}})
            ),
            vec![]
        );
        let bad_prefix = check(
            "",
            "v1",
            "ConfigMap",
            json!({"metadata": {"generateName": "Cfg-"}}),
        );
        find(&bad_prefix, "metadata.generateName");
    }

    #[test]
    fn metadata_maps_and_references() {
        let big = "x".repeat(TOTAL_ANNOTATION_SIZE_LIMIT);
        let obj = json!({"metadata": {
            "name": "c",
            "labels": {"bad key": "v", "ok": "bad value!"},
            "annotations": {"big": big},
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "a", "uid": "1", "controller": true},
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "b", "uid": "2", "controller": true},
                {"apiVersion": "", "kind": "", "name": "", "uid": ""}
            ],
            "finalizers": ["orphan", "foregroundDeletion"]
        }});
        let causes = validate("", "v1", "ConfigMap", &obj, None);
        let labels: Vec<&Cause> = causes
            .iter()
            .filter(|c| c.field == "metadata.labels")
            .collect();
        assert_eq!(labels.len(), 2, "{causes:?}");
        assert_eq!(
            find(&causes, "metadata.annotations").message,
            "Too long: may not be more than 262144 bytes"
        );
        assert!(causes.iter().any(|c| c.message.contains("Only one reference can have Controller set to true. Found \"true\" in references for ReplicaSet/a and ReplicaSet/b")));
        assert_eq!(
            find(&causes, "metadata.ownerReferences.apiVersion").message,
            "Invalid value: \"\": version must not be empty"
        );
        assert!(find(&causes, "metadata.finalizers")
            .message
            .ends_with("finalizer orphan and foregroundDeletion cannot be both set"));
    }

    #[test]
    fn deployment_updates() {
        let mut new = deployment();
        new["spec"]["selector"] = json!({"matchLabels": {"app": "web", "tier": "x"}});
        new["spec"]["template"]["metadata"]["labels"]["tier"] = json!("x");
        let causes = check_update("apps", "v1", "Deployment", deployment(), new);
        assert!(find(&causes, "spec.selector")
            .message
            .ends_with("field is immutable"));
        let mut scaled = deployment();
        scaled["spec"]["replicas"] = json!(5);
        scaled["metadata"]["uid"] = json!("");
        assert_eq!(
            check_update("apps", "v1", "Deployment", deployment(), scaled),
            vec![]
        );
        let mut renamed = deployment();
        renamed["metadata"]["name"] = json!("other");
        assert!(find(
            &check_update("apps", "v1", "Deployment", deployment(), renamed),
            "metadata.name"
        )
        .message
        .ends_with("field is immutable"));
    }

    #[test]
    fn deployment_strategies() {
        let mut d = deployment();
        d["spec"]["strategy"] = json!({"type": "Recreate", "rollingUpdate": {"maxSurge": 1}});
        let causes = check("apps", "v1", "Deployment", d);
        assert_eq!(
            find(&causes, "spec.strategy.rollingUpdate").message,
            "Forbidden: may not be specified when strategy `type` is 'Recreate'"
        );
        let mut d = deployment();
        d["spec"]["strategy"] = json!({"rollingUpdate": {"maxSurge": 0, "maxUnavailable": "0%"}});
        let causes = check("apps", "v1", "Deployment", d);
        assert!(find(&causes, "spec.strategy.rollingUpdate.maxUnavailable")
            .message
            .ends_with("may not be 0 when `maxSurge` is 0"));
        let mut d = deployment();
        d["spec"]["strategy"] = json!({"type": "BlueGreen"});
        let causes = check("apps", "v1", "Deployment", d);
        assert_eq!(
            find(&causes, "spec.strategy.type").message,
            "Unsupported value: \"BlueGreen\": supported values: \"Recreate\", \"RollingUpdate\""
        );
        let mut d = deployment();
        d["spec"]["strategy"] =
            json!({"rollingUpdate": {"maxSurge": "abc", "maxUnavailable": "120%"}});
        let causes = check("apps", "v1", "Deployment", d);
        assert!(find(&causes, "spec.strategy.rollingUpdate.maxSurge")
            .message
            .ends_with("must be an integer or percentage (e.g '5%')"));
        assert!(causes
            .iter()
            .any(|c| c.message.ends_with("must not be greater than 100%")));
    }

    #[test]
    fn container_rules() {
        let mut d = deployment();
        let c = json!([
            {"name": "a", "image": "x", "ports": [{"containerPort": 70000, "protocol": "HTTP"}, {"containerPort": 1, "name": "Bad--"}]},
            {"name": "a", "image": "", "imagePullPolicy": "Sometimes"},
            {"name": "B", "image": " y", "volumeMounts": [{"name": "nope", "mountPath": "/m"}], "env": [{"name": "A=B"}]}
        ]);
        d["spec"]["template"]["spec"]["containers"] = c;
        d["spec"]["template"]["spec"]["restartPolicy"] = json!("Never");
        let causes = check("apps", "v1", "Deployment", d);
        let p = "spec.template.spec.containers";
        assert_eq!(
            find(&causes, &format!("{p}[0].ports[0].containerPort")).message,
            "Invalid value: 70000: must be between 1 and 65535, inclusive"
        );
        assert_eq!(
            find(&causes, &format!("{p}[0].ports[0].protocol")).message,
            "Unsupported value: \"HTTP\": supported values: \"SCTP\", \"TCP\", \"UDP\""
        );
        find(&causes, &format!("{p}[0].ports[1].name"));
        assert_eq!(
            find(&causes, &format!("{p}[1].name")).message,
            "Duplicate value: \"a\""
        );
        assert_eq!(
            find(&causes, &format!("{p}[1].image")).message,
            "Required value"
        );
        find(&causes, &format!("{p}[1].imagePullPolicy"));
        find(&causes, &format!("{p}[2].name"));
        assert!(find(&causes, &format!("{p}[2].image"))
            .message
            .ends_with("must not have leading or trailing whitespace"));
        assert_eq!(
            find(&causes, &format!("{p}[2].volumeMounts[0].name")).message,
            "Not found: \"nope\""
        );
        find(&causes, &format!("{p}[2].env[0].name"));
        assert_eq!(
            find(&causes, "spec.template.spec.restartPolicy").message,
            "Unsupported value: \"Never\": supported values: \"Always\""
        );
    }

    #[test]
    fn resource_requests_within_limits() {
        let mut p = pod();
        p["spec"]["containers"][0]["resources"] = json!({"limits": {"cpu": "500m", "memory": "1Gi"}, "requests": {"cpu": "1", "memory": "lots"}});
        let causes = check("", "v1", "Pod", p);
        assert_eq!(
            find(&causes, "spec.containers[0].resources.requests").message,
            "Invalid value: \"1\": must be less than or equal to cpu limit of 500m"
        );
        assert!(
            find(&causes, "spec.containers[0].resources.requests[memory]")
                .message
                .contains("quantities must match")
        );
        assert_eq!(
            parse_quantity(&json!("1.5Gi")),
            Some(1.5 * 1024.0 * 1024.0 * 1024.0)
        );
        assert_eq!(parse_quantity(&json!("100m")), Some(0.1));
        assert_eq!(parse_quantity(&json!("2e3")), Some(2000.0));
        assert_eq!(parse_quantity(&json!(".5")), Some(0.5));
        assert_eq!(parse_quantity(&json!(3)), Some(3.0));
        for bad in ["", "m", "1.2.3", "1Gb", "1e", "abc"] {
            assert_eq!(parse_quantity(&json!(bad)), None, "{bad}");
        }
    }

    #[test]
    fn pod_create_and_update() {
        assert_eq!(check("", "v1", "Pod", pod()), vec![]);
        let mut empty = pod();
        empty["spec"]["containers"] = json!([]);
        assert_eq!(
            find(&check("", "v1", "Pod", empty), "spec.containers").message,
            "Required value"
        );
        let mut bad_rp = pod();
        bad_rp["spec"]["restartPolicy"] = json!("Sometimes");
        find(&check("", "v1", "Pod", bad_rp), "spec.restartPolicy");

        let mut image = pod();
        image["spec"]["containers"][0]["image"] = json!("busybox:1.37");
        image["metadata"]["labels"] = json!({"new": "label"});
        image["spec"]["tolerations"] =
            json!([{"key": "k", "operator": "Exists", "effect": "NoSchedule"}]);
        assert_eq!(check_update("", "v1", "Pod", pod(), image), vec![]);

        let mut port = pod();
        port["spec"]["containers"][0]["ports"][0]["containerPort"] = json!(9090);
        let causes = check_update("", "v1", "Pod", pod(), port);
        let c = find(&causes, "spec");
        assert_eq!(c.reason, "FieldValueForbidden");
        assert!(c.message.starts_with("Forbidden: pod updates may not change fields other than `spec.containers[*].image`"), "{}", c.message);
        assert!(c
            .message
            .contains("spec.containers[0].ports[0].containerPort"));

        let mut node = pod();
        node["spec"]["nodeName"] = json!("node-1");
        find(&check_update("", "v1", "Pod", pod(), node), "spec");

        let mut deadline = pod();
        deadline["spec"]["activeDeadlineSeconds"] = json!(100);
        let mut longer = deadline.clone();
        longer["spec"]["activeDeadlineSeconds"] = json!(200);
        let causes = check_update("", "v1", "Pod", deadline.clone(), longer);
        assert!(find(&causes, "spec.activeDeadlineSeconds")
            .message
            .ends_with("must be less than or equal to previous value"));
        let mut shorter = deadline.clone();
        shorter["spec"]["activeDeadlineSeconds"] = json!(50);
        assert_eq!(check_update("", "v1", "Pod", deadline, shorter), vec![]);
    }

    #[test]
    fn tolerations() {
        let mut p = pod();
        p["spec"]["tolerations"] = json!([
            {"operator": "Equal", "value": "x"},
            {"key": "a", "operator": "Exists", "value": "v"},
            {"key": "b", "operator": "Equal", "effect": "NoSchedule", "tolerationSeconds": 5},
            {"key": "c", "operator": "Maybe"}
        ]);
        let causes = check("", "v1", "Pod", p);
        assert!(find(&causes, "spec.tolerations[0].operator")
            .message
            .contains("operator must be Exists when `key` is empty"));
        assert!(find(&causes, "spec.tolerations[1].operator")
            .message
            .ends_with("value must be empty when `operator` is 'Exists'"));
        find(&causes, "spec.tolerations[2].effect");
        find(&causes, "spec.tolerations[3].operator");
    }

    #[test]
    fn services() {
        assert_eq!(
            check(
                "",
                "v1",
                "Service",
                json!({"metadata": {"name": "web"}, "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}})
            ),
            vec![]
        );
        let causes = check(
            "",
            "v1",
            "Service",
            json!({"metadata": {"name": "web"}, "spec": {}}),
        );
        assert_eq!(find(&causes, "spec.ports").message, "Required value");
        assert_eq!(
            check(
                "",
                "v1",
                "Service",
                json!({"metadata": {"name": "ext"}, "spec": {"type": "ExternalName", "externalName": "example.com"}})
            ),
            vec![]
        );
        let causes = check(
            "",
            "v1",
            "Service",
            json!({"metadata": {"name": "web"}, "spec": {"type": "Magic", "clusterIP": "x.y", "ports": [{"port": 0}, {"port": 80, "targetPort": "Bad_Name", "nodePort": 30000}]}}),
        );
        find(&causes, "spec.type");
        assert_eq!(
            find(&causes, "spec.ports[0].name").message,
            "Required value"
        );
        assert_eq!(
            find(&causes, "spec.ports[0].port").message,
            "Invalid value: 0: must be between 1 and 65535, inclusive"
        );
        find(&causes, "spec.ports[1].targetPort");
        find(&causes, "spec.clusterIPs[0]");
        let causes = check(
            "",
            "v1",
            "Service",
            json!({"metadata": {"name": "web"}, "spec": {"ports": [{"port": 80, "name": "a", "nodePort": 30001}, {"port": 80, "name": "a"}]}}),
        );
        assert_eq!(
            find(&causes, "spec.ports[0].nodePort").message,
            "Forbidden: may not be used when `type` is 'ClusterIP'"
        );
        find(&causes, "spec.ports[1].name");
        find(&causes, "spec.ports[1]");
        let old = json!({"metadata": {"name": "web"}, "spec": {"clusterIP": "10.0.0.1", "ports": [{"port": 80}]}});
        let mut new = old.clone();
        new["spec"]["clusterIP"] = json!("10.0.0.2");
        find(
            &check_update("", "v1", "Service", old, new),
            "spec.clusterIPs[0]",
        );
    }

    #[test]
    fn config_maps_and_secrets() {
        let causes = check(
            "",
            "v1",
            "ConfigMap",
            json!({"metadata": {"name": "c"}, "data": {"ok.key": "v", "bad/key": "v", "..x": "v", "dup": "a"}, "binaryData": {"dup": "eA=="}}),
        );
        assert!(find(&causes, "data[bad/key]")
            .message
            .contains("a valid config key must consist of alphanumeric characters"));
        assert_eq!(
            find(&causes, "data[..x]").message,
            "Invalid value: \"..x\": must not start with '..'"
        );
        assert!(find(&causes, "data[dup]")
            .message
            .ends_with("duplicate of key present in binaryData"));
        let causes = check(
            "",
            "v1",
            "ConfigMap",
            json!({"metadata": {"name": "c"}, "data": {"port": 8080}}),
        );
        assert!(
            find(&causes, "data.port")
                .message
                .contains("expected a string"),
            "{causes:?}"
        );
        assert_eq!(
            check(
                "",
                "v1",
                "Secret",
                json!({"metadata": {"name": "s"}, "data": {"empty": null}})
            ),
            vec![]
        );
        let big = "x".repeat(MAX_SECRET_SIZE + 1);
        let causes = check(
            "",
            "v1",
            "ConfigMap",
            json!({"metadata": {"name": "c"}, "data": {"big": big}}),
        );
        assert_eq!(
            find(&causes, "").message,
            "Too long: may not be more than 1048576 bytes"
        );

        let causes = check(
            "",
            "v1",
            "Secret",
            json!({"metadata": {"name": "s"}, "data": {"a": "not base64!"}}),
        );
        assert_eq!(causes.len(), 1, "{causes:?}");
        assert!(find(&causes, "data[a]")
            .message
            .contains("illegal base64 data at input byte"));
        let causes = check(
            "",
            "v1",
            "Secret",
            json!({"metadata": {"name": "s"}, "type": "kubernetes.io/tls", "data": {"tls.crt": "eA=="}}),
        );
        assert_eq!(fields(&causes), vec!["data[tls.key]"]);
        assert_eq!(
            check(
                "",
                "v1",
                "Secret",
                json!({"metadata": {"name": "s"}, "stringData": {"password": "hunter2"}})
            ),
            vec![]
        );

        let old = json!({"metadata": {"name": "s"}, "immutable": true, "data": {"a": "eA=="}});
        let mut new = old.clone();
        new["data"]["a"] = json!("eQ==");
        new["type"] = json!("kubernetes.io/basic-auth");
        let causes = check_update("", "v1", "Secret", old, new);
        assert_eq!(
            find(&causes, "data").message,
            "Forbidden: field is immutable when `immutable` is set"
        );
        assert!(find(&causes, "type")
            .message
            .ends_with("field is immutable"));
    }

    fn job_json() -> Value {
        json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "pi", "namespace": "default", "uid": "u-1"},
            "spec": {"template": {"spec": {"containers": [{"name": "pi", "image": "perl:5"}], "restartPolicy": "Never"}}}
        })
    }

    fn created_job(mut j: Value) -> Value {
        defaults::apply("batch", "Job", &mut j);
        defaults::job_selector(&mut j, "u-1");
        j
    }

    #[test]
    fn jobs() {
        let j = created_job(job_json());
        assert_eq!(validate("batch", "v1", "Job", &j, None), vec![]);
        let mut no_policy = job_json();
        no_policy["spec"]["template"]["spec"]
            .as_object_mut()
            .unwrap()
            .remove("restartPolicy");
        let causes = validate("batch", "v1", "Job", &created_job(no_policy), None);
        assert_eq!(
            find(&causes, "spec.template.spec.restartPolicy").message,
            "Unsupported value: \"Always\": supported values: \"OnFailure\", \"Never\""
        );
        let mut changed = j.clone();
        changed["spec"]["template"]["spec"]["containers"][0]["image"] = json!("perl:6");
        let causes = validate("batch", "v1", "Job", &changed, Some(&j));
        assert!(find(&causes, "spec.template")
            .message
            .ends_with("field is immutable"));
        let mut suspended = j.clone();
        suspended["spec"]["suspend"] = json!(true);
        let mut rescheduled = suspended.clone();
        rescheduled["spec"]["template"]["spec"]["nodeSelector"] = json!({"zone": "a"});
        assert_eq!(
            validate("batch", "v1", "Job", &rescheduled, Some(&suspended)),
            vec![]
        );
        let mut manual = job_json();
        manual["spec"]["manualSelector"] = json!(true);
        find(
            &validate("batch", "v1", "Job", &created_job(manual), None),
            "spec.selector",
        );
    }

    #[test]
    fn cron_jobs() {
        let cj = |schedule: &str| {
            json!({"metadata": {"name": "c"}, "spec": {"schedule": schedule, "jobTemplate": {"spec": {"template": {"spec": {
                "containers": [{"name": "a", "image": "b:1"}], "restartPolicy": "OnFailure"}}}}}})
        };
        for ok in [
            "*/5 * * * *",
            "0 0 * * MON-FRI",
            "@hourly",
            "0 3 1,15 * *",
            "30 2 * JAN,jul sun",
            "@every 1h30m",
            "0 0 ? * *",
            "5/10 * * * *",
        ] {
            assert_eq!(check("batch", "v1", "CronJob", cj(ok)), vec![], "{ok}");
        }
        for (bad, msg) in [
            ("* * *", "expected exactly 5 fields, found 3: [* * *]"),
            ("61 * * * *", "end of range (61) above maximum (59): 61"),
            ("* * 0 * *", "beginning of range (0) below minimum (1): 0"),
            (
                "5-1 * * * *",
                "beginning of range (5) beyond end of range (1): 5-1",
            ),
            (
                "*/0 * * * *",
                "step of range should be a positive number: */0",
            ),
            (
                "x * * * *",
                "failed to parse int from x: strconv.Atoi: parsing \"x\": invalid syntax",
            ),
            ("1-2-3 * * * *", "too many hyphens: 1-2-3"),
            ("@fortnightly", "unrecognized descriptor: @fortnightly"),
            ("* * * * 7", "end of range (7) above maximum (6): 7"),
        ] {
            let causes = check("batch", "v1", "CronJob", cj(bad));
            assert_eq!(
                find(&causes, "spec.schedule").message,
                format!("Invalid value: {bad:?}: {msg}")
            );
        }
        let mut missing = cj("");
        missing["spec"].as_object_mut().unwrap().remove("schedule");
        assert_eq!(
            find(&check("batch", "v1", "CronJob", missing), "spec.schedule").message,
            "Required value"
        );
        let tz = check("batch", "v1", "CronJob", cj("TZ=UTC 0 * * * *"));
        assert!(find(&tz, "spec.schedule")
            .message
            .ends_with("cannot use TZ or CRON_TZ in schedule, use timeZone field instead"));
        let mut long = cj("@daily");
        long["metadata"]["name"] = json!("a".repeat(53));
        find(&check("batch", "v1", "CronJob", long), "metadata.name");
        let mut always = cj("@daily");
        always["spec"]["jobTemplate"]["spec"]["template"]["spec"]["restartPolicy"] =
            json!("Always");
        find(
            &check("batch", "v1", "CronJob", always),
            "spec.jobTemplate.spec.template.spec.restartPolicy",
        );
    }

    #[test]
    fn stateful_sets() {
        let sts = json!({"metadata": {"name": "db"}, "spec": {
            "selector": {"matchLabels": {"app": "db"}}, "serviceName": "db",
            "template": {"metadata": {"labels": {"app": "db"}}, "spec": {"containers": [{"name": "db", "image": "redis:7"}]}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]
        }});
        assert_eq!(check("apps", "v1", "StatefulSet", sts.clone()), vec![]);
        let mut scaled = sts.clone();
        scaled["spec"]["replicas"] = json!(3);
        assert_eq!(
            check_update("apps", "v1", "StatefulSet", sts.clone(), scaled),
            vec![]
        );
        let mut bigger = sts.clone();
        bigger["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] =
            json!("2Gi");
        let causes = check_update("apps", "v1", "StatefulSet", sts.clone(), bigger);
        assert!(find(&causes, "spec").message.starts_with(
            "Forbidden: updates to statefulset spec for fields other than 'replicas'"
        ));
        let mut bad = sts;
        bad["spec"]["podManagementPolicy"] = json!("Random");
        bad["spec"]["selector"] = json!({});
        let causes = check("apps", "v1", "StatefulSet", bad);
        find(&causes, "spec.podManagementPolicy");
        assert!(find(&causes, "spec.selector")
            .message
            .ends_with("empty selector is invalid for statefulset"));
    }

    #[test]
    fn daemon_sets_replica_sets_and_rcs() {
        let tmpl = json!({"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{"name": "c", "image": "i:1"}]}});
        let ds = json!({"metadata": {"name": "d"}, "spec": {"selector": {"matchLabels": {"app": "x"}}, "template": tmpl}});
        assert_eq!(check("apps", "v1", "DaemonSet", ds.clone()), vec![]);
        let mut ds_bad = ds.clone();
        ds_bad["spec"]["updateStrategy"] =
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 0}});
        find(
            &check("apps", "v1", "DaemonSet", ds_bad),
            "spec.updateStrategy.rollingUpdate.maxUnavailable",
        );
        let rs = json!({"metadata": {"name": "r"}, "spec": {"selector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["x"]}]}, "template": tmpl}});
        assert_eq!(check("apps", "v1", "ReplicaSet", rs), vec![]);
        let rs_bad = json!({"metadata": {"name": "r"}, "spec": {"selector": {"matchExpressions": [{"key": "app", "operator": "In"}]}, "template": tmpl}});
        let causes = check("apps", "v1", "ReplicaSet", rs_bad);
        assert_eq!(
            find(&causes, "spec.selector.matchExpressions[0].values").message,
            "Required value: must be specified when `operator` is 'In' or 'NotIn'"
        );
        let rc = json!({"metadata": {"name": "r"}, "spec": {"template": tmpl}});
        assert_eq!(check("", "v1", "ReplicationController", rc), vec![]);
        let rc_bad = json!({"metadata": {"name": "r"}, "spec": {"selector": {"app": "y"}, "template": tmpl}});
        find(
            &check("", "v1", "ReplicationController", rc_bad),
            "spec.template.metadata.labels",
        );
    }

    #[test]
    fn small_kinds() {
        let hpa = json!({"apiVersion": "autoscaling/v2", "metadata": {"name": "h"}, "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}, "minReplicas": 3, "maxReplicas": 2}});
        let causes = check("autoscaling", "v2", "HorizontalPodAutoscaler", hpa);
        assert!(find(&causes, "spec.maxReplicas")
            .message
            .ends_with("must be greater than or equal to `minReplicas`"));
        let lease = json!({"metadata": {"name": "l"}, "spec": {"holderIdentity": "me", "leaseDurationSeconds": 0, "renewTime": "2026-01-01T00:00:00.000000Z"}});
        find(
            &check("coordination.k8s.io", "v1", "Lease", lease),
            "spec.leaseDurationSeconds",
        );
        let ns = json!({"metadata": {"name": "team-a"}, "spec": {"finalizers": ["kubernetes", "bad finalizer"]}});
        find(&check("", "v1", "Namespace", ns), "spec.finalizers");
        // Unknown kinds get only metadata checks.
        assert_eq!(
            validate(
                "example.com",
                "v1",
                "Widget",
                &json!({"metadata": {"name": "w"}, "spec": {"anything": 1}}),
                None
            ),
            vec![]
        );
    }

    #[test]
    fn finalizers_cannot_be_added_while_deleting() {
        let old = json!({"metadata": {"name": "c", "deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["a.io/x"]}});
        let mut new = old.clone();
        new["metadata"]["finalizers"] = json!(["a.io/x", "b.io/y"]);
        let causes = validate("", "v1", "ConfigMap", &new, Some(&old));
        assert!(find(&causes, "metadata.finalizers").message.contains("no new finalizers can be added if the object is being deleted, found new finalizers []string{\"b.io/y\"}"));
        new["metadata"]["finalizers"] = json!([]);
        assert_eq!(validate("", "v1", "ConfigMap", &new, Some(&old)), vec![]);
    }

    #[test]
    fn render_maps_lines_to_paths() {
        let v = json!({"a": {"b": [1, {"c": "x"}]}, "d": true});
        let (text, lines) = typed::render(&v);
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), v);
        let paths: Vec<String> = lines.iter().map(|p| typed::path_string(p)).collect();
        let line_of = |needle: &str| text.lines().position(|l| l.contains(needle)).unwrap();
        assert_eq!(paths[line_of("\"c\"")], "a.b[1].c");
        assert_eq!(paths[line_of("true")], "d");
    }
}
