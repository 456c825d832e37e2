//! Custom resources: what a `CustomResourceDefinition` establishes, and how custom objects are
//! defaulted, pruned and validated on the generic write path.
//!
//! A CRD is an ordinary stored object. [`establish`] (the server's own loop, in
//! [`controller`]) turns the set of CRDs into served resources — one [`ResourceDef`] per served
//! version, all sharing one storage prefix — replaces the server's registry snapshot, and keeps
//! each CRD's status (`acceptedNames`, `storedVersions`, `NamesAccepted`, `Established`,
//! `Terminating`) true. Deleting a CRD first deletes its objects (the
//! `customresourcecleanup.apiextensions.k8s.io` finalizer).
//!
//! Schemas are applied by [`schema`]; their CEL rules (`x-kubernetes-validations`) by
//! [`cel`], which says what of CEL is covered.
//!
//! [`establish`]: controller
//! [`ResourceDef`]: crate::registry::ResourceDef

pub mod cel;
pub mod columns;
pub mod controller;
pub mod conversion;
pub mod schema;

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::{json, Value};
use setpoint_api::{meta, Cause};

use crate::registry::ResourceDef;

/// The group and kind of CustomResourceDefinitions.
pub const CRD_GROUP: &str = "apiextensions.k8s.io";
/// See [`CRD_GROUP`].
pub const CRD_KIND: &str = "CustomResourceDefinition";
/// The finalizer that makes deleting a CRD delete its objects first.
pub const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

/// Where a custom resource's scale subresource reads and writes (JSON paths like
/// `.spec.replicas`, as JSON pointers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScalePaths {
    /// `specReplicasPath`: where the desired replica count is.
    pub spec_replicas: String,
    /// `statusReplicasPath`: where the observed replica count is.
    pub status_replicas: String,
    /// `labelSelectorPath`: where the pods' selector (in string form) is, if the CRD says.
    pub label_selector: Option<String>,
}

/// What the server knows about one served version of a custom resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CustomResource {
    /// The CRD's name (`<plural>.<group>`).
    pub crd_name: String,
    /// The version objects are stored in (they are rewritten to it on the way in and to the
    /// requested version on the way out: conversion `None`).
    pub storage_version: String,
    /// The version's `openAPIV3Schema`, when it has one.
    pub schema: Option<Value>,
    /// The version's `additionalPrinterColumns`.
    pub columns: Vec<Value>,
    /// The version's scale subresource, when it has one.
    pub scale: Option<ScalePaths>,
    /// The CRD is being deleted: no new objects.
    pub terminating: bool,
    /// The schema declares defaults (applied on every read as well as on writes).
    pub has_defaults: bool,
    /// The CRD's conversion webhook (`spec.conversion.strategy: Webhook`): objects not in
    /// the wanted version are converted by it, on reads and writes.
    pub webhook: Option<conversion::WebhookConversion>,
}

/// Whether a schema declares a `default` anywhere.
fn declares_default(schema: &Value) -> bool {
    match schema {
        Value::Object(m) => {
            m.contains_key("default")
                || m.iter()
                    .filter(|(k, _)| *k != "default")
                    .any(|(_, v)| declares_default(v))
        }
        Value::Array(items) => items.iter().any(declares_default),
        _ => false,
    }
}

fn str_at<'a>(v: &'a Value, path: &str) -> &'a str {
    v.pointer(path).and_then(Value::as_str).unwrap_or("")
}

/// A JSON path of the simple form CRDs use (`.spec.replicas`) as a JSON pointer.
pub fn json_path_to_pointer(path: &str) -> String {
    path.trim_start_matches('.')
        .split('.')
        .filter(|s| !s.is_empty())
        .fold(String::new(), |mut out, seg| {
            out.push('/');
            out.push_str(seg);
            out
        })
}

/// The served resources one CRD defines (empty when it defines none).
pub fn resource_defs(crd: &Value) -> Vec<ResourceDef> {
    let spec = &crd["spec"];
    let group = str_at(spec, "/group");
    let names = &spec["names"];
    let plural = str_at(names, "/plural");
    let kind = str_at(names, "/kind");
    if group.is_empty() || plural.is_empty() || kind.is_empty() {
        return Vec::new();
    }
    let singular = match str_at(names, "/singular") {
        "" => kind.to_lowercase(),
        s => s.to_string(),
    };
    let list = |key: &str| -> Vec<String> {
        names
            .get(key)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default()
    };
    let versions = spec["versions"].as_array().cloned().unwrap_or_default();
    let storage_version = versions
        .iter()
        .find(|v| v["storage"] == json!(true))
        .map(|v| str_at(v, "/name").to_string())
        .unwrap_or_default();
    let terminating = meta::deletion_timestamp(crd).is_some();
    let webhook = conversion::webhook_of(spec);
    versions
        .iter()
        .filter(|v| v["served"] == json!(true))
        .map(|v| {
            let subresources = &v["subresources"];
            let scale = subresources
                .get("scale")
                .filter(|s| s.is_object())
                .map(|s| ScalePaths {
                    spec_replicas: json_path_to_pointer(str_at(s, "/specReplicasPath")),
                    status_replicas: json_path_to_pointer(str_at(s, "/statusReplicasPath")),
                    label_selector: s
                        .get("labelSelectorPath")
                        .and_then(Value::as_str)
                        .map(json_path_to_pointer),
                });
            ResourceDef {
                group: group.into(),
                version: str_at(v, "/name").into(),
                kind: kind.into(),
                plural: plural.into(),
                singular: singular.clone(),
                namespaced: str_at(spec, "/scope") != "Cluster",
                short_names: list("shortNames"),
                categories: list("categories"),
                status: subresources.get("status").is_some_and(Value::is_object),
                scale: scale.is_some(),
                generation: true,
                storage_group: group.into(),
                storage_plural: plural.into(),
                custom: Some(Arc::new(CustomResource {
                    crd_name: meta::name(crd).to_string(),
                    storage_version: storage_version.clone(),
                    schema: v.pointer("/schema/openAPIV3Schema").cloned(),
                    columns: v["additionalPrinterColumns"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default(),
                    scale,
                    terminating,
                    has_defaults: v
                        .pointer("/schema/openAPIV3Schema")
                        .is_some_and(declares_default),
                    webhook: webhook.clone(),
                })),
            }
        })
        .collect()
}

/// Defaults a CRD the way the API server does (singular, listKind, conversion strategy).
pub fn default_crd(crd: &mut Value) {
    let Some(spec) = crd.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    if let Some(names) = spec.get_mut("names").and_then(Value::as_object_mut) {
        let kind = names
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if !kind.is_empty() {
            names
                .entry("singular")
                .or_insert_with(|| json!(kind.to_lowercase()));
            names
                .entry("listKind")
                .or_insert_with(|| json!(format!("{kind}List")));
        }
    }
    spec.entry("conversion")
        .or_insert_with(|| json!({"strategy": "None"}));
}

/// Steps on CRD creation: the cleanup finalizer.
pub fn on_create_crd(crd: &mut Value) {
    let Some(m) = crd.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    let fins = m.entry("finalizers").or_insert_with(|| json!([]));
    if let Some(list) = fins.as_array_mut() {
        if !list.iter().any(|f| f == CLEANUP_FINALIZER) {
            list.push(json!(CLEANUP_FINALIZER));
        }
    }
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// The rules a CRD must satisfy beyond its types (upstream's CRD validation, the parts that
/// matter for serving it).
pub fn validate_crd(crd: &Value, old: Option<&Value>) -> Vec<Cause> {
    let mut causes = Vec::new();
    let spec = &crd["spec"];
    let group = str_at(spec, "/group");
    let plural = str_at(spec, "/names/plural");
    let kind = str_at(spec, "/names/kind");
    let name = meta::name(crd);
    if group.is_empty() {
        causes.push(Cause::required("spec.group", ""));
    } else if !group.contains('.') || !group.split('.').all(is_dns_label) {
        causes.push(Cause::invalid(
            "spec.group",
            &json!(group),
            "should be a domain with at least one dot",
        ));
    }
    if plural.is_empty() {
        causes.push(Cause::required("spec.names.plural", ""));
    } else if !is_dns_label(plural) {
        causes.push(Cause::invalid(
            "spec.names.plural",
            &json!(plural),
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'",
        ));
    }
    if kind.is_empty() {
        causes.push(Cause::required("spec.names.kind", ""));
    }
    if !group.is_empty() && !plural.is_empty() && name != format!("{plural}.{group}") {
        causes.push(Cause::invalid(
            "metadata.name",
            &json!(name),
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    let scope = str_at(spec, "/scope");
    if scope != "Namespaced" && scope != "Cluster" {
        causes.push(Cause::not_supported(
            "spec.scope",
            &json!(scope),
            &["Cluster", "Namespaced"],
        ));
    }
    let versions = spec["versions"].as_array().cloned().unwrap_or_default();
    if versions.is_empty() {
        causes.push(Cause::required(
            "spec.versions",
            "must have exactly one version marked as storage version",
        ));
    }
    let mut seen = BTreeSet::new();
    let mut storage = 0;
    for (i, v) in versions.iter().enumerate() {
        let vname = str_at(v, "/name");
        if !is_dns_label(vname) {
            causes.push(Cause::invalid(
                format!("spec.versions[{i}].name"),
                &json!(vname),
                "a DNS-1035 label",
            ));
        }
        if !seen.insert(vname.to_string()) {
            causes.push(Cause::duplicate(
                format!("spec.versions[{i}].name"),
                &json!(vname),
            ));
        }
        if v["storage"] == json!(true) {
            storage += 1;
        }
        if let Some(s) = v.pointer("/schema/openAPIV3Schema") {
            causes.extend(schema::check_schema(
                s,
                &format!("spec.versions[{i}].schema.openAPIV3Schema"),
            ));
        }
        if let Some(scale) = v.pointer("/subresources/scale") {
            for key in ["specReplicasPath", "statusReplicasPath"] {
                let p = str_at(scale, &format!("/{key}"));
                if !p.starts_with('.') {
                    causes.push(Cause::invalid(
                        format!("spec.versions[{i}].subresources.scale.{key}"),
                        &json!(p),
                        "should be a JSON path under .spec or .status",
                    ));
                }
            }
        }
    }
    if !versions.is_empty() && storage != 1 {
        causes.push(Cause::invalid(
            "spec.versions",
            &json!(versions
                .iter()
                .map(|v| str_at(v, "/name"))
                .collect::<Vec<_>>()),
            "must have exactly one version marked as storage version",
        ));
    }
    if !versions.iter().any(|v| v["served"] == json!(true)) && !versions.is_empty() {
        causes.push(Cause::invalid(
            "spec.versions",
            &json!(versions
                .iter()
                .map(|v| str_at(v, "/name"))
                .collect::<Vec<_>>()),
            "must have at least one version served",
        ));
    }
    causes.extend(conversion::validate(spec));
    if let Some(old) = old {
        for (field, ptr) in [
            ("spec.group", "/spec/group"),
            ("spec.names.plural", "/spec/names/plural"),
            ("spec.scope", "/spec/scope"),
        ] {
            if old.pointer(ptr) != crd.pointer(ptr) && old.pointer(ptr).is_some() {
                causes.push(Cause::immutable(
                    field,
                    crd.pointer(ptr).unwrap_or(&Value::Null),
                ));
            }
        }
    }
    causes
}

/// Whether `res` is the CustomResourceDefinition resource itself.
pub fn is_crd(res: &ResourceDef) -> bool {
    res.group == CRD_GROUP && res.kind == CRD_KIND
}

/// Defaulting and pruning of an object about to be written (custom objects by their schema,
/// CRDs by their own rules); returns the paths pruned.
pub fn admit(res: &ResourceDef, obj: &mut Value) -> Vec<String> {
    if is_crd(res) {
        default_crd(obj);
        return Vec::new();
    }
    let Some(custom) = &res.custom else {
        return Vec::new();
    };
    let Some(s) = &custom.schema else {
        return Vec::new();
    };
    schema::default(s, obj);
    schema::prune(s, obj)
}

/// The fields a custom object has that its schema does not declare (for `fieldValidation`).
pub fn unknown_fields(res: &ResourceDef, obj: &Value) -> Vec<String> {
    match res.custom.as_ref().and_then(|c| c.schema.as_ref()) {
        Some(s) => {
            let mut copy = obj.clone();
            schema::prune(s, &mut copy)
        }
        None => Vec::new(),
    }
}

/// Validation beyond the built-in kinds' rules: CRDs' own rules, custom objects' schemas.
pub fn validate(res: &ResourceDef, obj: &Value, old: Option<&Value>) -> Vec<Cause> {
    if is_crd(res) {
        return validate_crd(obj, old);
    }
    match res.custom.as_ref().and_then(|c| c.schema.as_ref()) {
        Some(s) => schema::validate_update(s, obj, old),
        None => Vec::new(),
    }
}

/// A stored custom object as a served version shows it: conversion `None` (only the
/// `apiVersion` changes), with the version's schema defaults filled in.
pub fn to_version(res: &ResourceDef, mut obj: Value) -> Value {
    if let Some(m) = obj.as_object_mut() {
        m.insert("apiVersion".into(), json!(res.api_version()));
    }
    if let Some(s) = res.custom.as_ref().and_then(|c| c.schema.as_ref()) {
        schema::default(s, &mut obj);
    }
    obj
}

/// A custom object as it is stored.
pub fn to_storage(res: &ResourceDef, mut obj: Value) -> Value {
    if let (Some(c), Some(m)) = (&res.custom, obj.as_object_mut()) {
        let av = setpoint_api::resource::api_version(&res.group, &c.storage_version);
        m.insert("apiVersion".into(), json!(av));
    }
    obj
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn crd() -> Value {
        json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "cronbackups.example.com"},
            "spec": {
                "group": "example.com",
                "scope": "Namespaced",
                "names": {"plural": "cronbackups", "kind": "CronBackup", "shortNames": ["cb"], "categories": ["all"]},
                "versions": [
                    {"name": "v1", "served": true, "storage": true,
                     "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}},
                     "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                         "spec": {"type": "object", "properties": {"schedule": {"type": "string", "default": "0 2 * * *"}}}}}},
                     "additionalPrinterColumns": [{"name": "Schedule", "type": "string", "jsonPath": ".spec.schedule"}]},
                    {"name": "v1beta1", "served": true, "storage": false},
                    {"name": "v1alpha1", "served": false, "storage": false}
                ]
            }
        })
    }

    #[test]
    fn served_versions_become_resources_sharing_storage() {
        let defs = resource_defs(&crd());
        assert_eq!(defs.len(), 2);
        let v1 = &defs[0];
        assert_eq!(
            (v1.group.as_str(), v1.version.as_str(), v1.plural.as_str()),
            ("example.com", "v1", "cronbackups")
        );
        assert_eq!(v1.singular, "cronbackup");
        assert!(v1.namespaced && v1.status && v1.scale && v1.generation);
        assert_eq!(v1.short_names, vec!["cb"]);
        assert_eq!(v1.storage_prefix(), defs[1].storage_prefix());
        let c = v1.custom.as_ref().unwrap();
        assert_eq!(c.storage_version, "v1");
        assert_eq!(c.scale.as_ref().unwrap().spec_replicas, "/spec/replicas");
        assert!(!defs[1].status, "subresources are per version");
        assert!(defs[1].is_converted() && !v1.is_converted());
    }

    #[test]
    fn crd_validation() {
        let mut c = crd();
        default_crd(&mut c);
        assert_eq!(c["spec"]["names"]["singular"], "cronbackup");
        assert_eq!(c["spec"]["names"]["listKind"], "CronBackupList");
        assert!(
            validate_crd(&c, None).is_empty(),
            "{:?}",
            validate_crd(&c, None)
        );
        let mut bad = crd();
        bad["metadata"]["name"] = json!("wrong");
        bad["spec"]["versions"][1]["storage"] = json!(true);
        bad["spec"]["scope"] = json!("Global");
        let fields: Vec<String> = validate_crd(&bad, None)
            .into_iter()
            .map(|c| c.field)
            .collect();
        assert!(fields.contains(&"metadata.name".to_string()));
        assert!(fields.contains(&"spec.versions".to_string()));
        assert!(fields.contains(&"spec.scope".to_string()));
        let mut moved = crd();
        moved["spec"]["group"] = json!("other.com");
        moved["metadata"]["name"] = json!("cronbackups.other.com");
        let fields: Vec<String> = validate_crd(&moved, Some(&crd()))
            .into_iter()
            .map(|c| c.field)
            .collect();
        assert_eq!(fields, vec!["spec.group"]);
    }

    #[test]
    fn versions_are_rewritten_on_the_way_in_and_out() {
        let defs = resource_defs(&crd());
        let beta = &defs[1];
        let stored = to_storage(
            beta,
            json!({"apiVersion": "example.com/v1beta1", "kind": "CronBackup"}),
        );
        assert_eq!(stored["apiVersion"], "example.com/v1");
        assert_eq!(
            to_version(beta, stored)["apiVersion"],
            "example.com/v1beta1"
        );
    }
}
