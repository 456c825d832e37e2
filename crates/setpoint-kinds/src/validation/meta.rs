//! Object metadata: the name rule of each kind and `ValidateObjectMeta` (name or
//! generateName, namespace, generation, finalizers) on create and update, with the label,
//! annotation and owner-reference rules it applies.

use serde_json::{json, Value};
use setpoint_api::names;
use setpoint_api::Cause;
use std::collections::{BTreeSet, HashSet};

use super::fields::{arr, at, child, entries, non_negative, qualified_name, s};

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
        // APIService names are `<version>.<group>` (`v1.` for the core group), checked as path
        // segments and then against the spec.
        ("apiregistration.k8s.io", "APIService") => NameRule::PathSegment,
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

/// `ValidateLabels`: every key a qualified name, every value a label value; the path is the
/// map's, as upstream reports it.
pub(super) fn labels(e: &mut Vec<Cause>, map: &Value, path: &str) {
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
pub(super) fn annotations(e: &mut Vec<Cause>, map: &Value, path: &str) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::testutil::{check, deployment, find};
    use crate::validation::validate;

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
    fn finalizers_cannot_be_added_while_deleting() {
        let old = json!({"metadata": {"name": "c", "deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["a.io/x"]}});
        let mut new = old.clone();
        new["metadata"]["finalizers"] = json!(["a.io/x", "b.io/y"]);
        let causes = validate("", "v1", "ConfigMap", &new, Some(&old));
        assert!(find(&causes, "metadata.finalizers").message.contains("no new finalizers can be added if the object is being deleted, found new finalizers []string{\"b.io/y\"}"));
        new["metadata"]["finalizers"] = json!([]);
        assert_eq!(validate("", "v1", "ConfigMap", &new, Some(&old)), vec![]);
    }
}
