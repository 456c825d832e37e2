//! Typed custom resources: `#[derive(CustomResource)]` (re-exported as
//! [`crate::CustomResource`]) turns a spec struct into a resource type and its
//! CustomResourceDefinition. This module holds what the generated code calls: the schema
//! generator and the CRD builder.
//!
//! Schemas come from [`schemars`] (derive `JsonSchema` on the spec and status types) and are
//! made *structural* as Kubernetes requires: every subschema inlined, `Option` fields
//! `nullable`, unit-variant enums as string `enum`s, and nothing Kubernetes rejects
//! (`$schema`, `$ref`, definitions, `additionalProperties: false`).
//!
//! ```
//! # use schemars::JsonSchema;
//! #[derive(JsonSchema)]
//! struct Spec { replicas: Option<i32>, mode: Mode }
//! #[derive(JsonSchema)]
//! enum Mode { Full, Incremental }
//! let s = setpoint_runtime::customresource::schema_of::<Spec>();
//! assert_eq!(s["properties"]["replicas"]["nullable"], true);
//! assert_eq!(s["properties"]["mode"]["enum"], serde_json::json!(["Full", "Incremental"]));
//! assert_eq!(s["required"], serde_json::json!(["mode"]));
//! ```

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{json, Map, Value};

/// What the derive passes to the generated code (not part of the stable API).
#[doc(hidden)]
pub mod __private {
    pub use k8s_openapi;
    pub use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    pub use serde;
}

/// The structural schema of `T`.
pub fn schema_of<T: schemars::JsonSchema>() -> Value {
    let mut settings = schemars::generate::SchemaSettings::openapi3();
    settings.inline_subschemas = true;
    let schema = settings.into_generator().into_root_schema_for::<T>();
    let mut v = schema.to_value();
    structural(&mut v);
    if let Some(m) = v.as_object_mut() {
        for k in ["$schema", "title", "definitions", "$defs", "components"] {
            m.remove(k);
        }
    }
    v
}

/// Rewrites a generated schema into the structural form Kubernetes accepts.
fn structural(v: &mut Value) {
    let Some(m) = v.as_object_mut() else {
        return;
    };
    // `additionalProperties: false` (deny_unknown_fields) next to properties is not allowed;
    // the server prunes unknown fields anyway.
    if m.get("additionalProperties") == Some(&Value::Bool(false)) {
        m.remove("additionalProperties");
    }
    m.remove("$schema");
    // `anyOf: [{...}, {nullable/null}]` from Option<T> with a complex T: fold into T + nullable.
    if let Some(Value::Array(any)) = m.get("anyOf").cloned() {
        let non_null: Vec<&Value> = any
            .iter()
            .filter(|s| s.get("type") != Some(&json!("null")) && !is_nullable_only(s))
            .collect();
        if non_null.len() == 1 && any.len() == 2 {
            let inner = non_null[0].clone();
            m.remove("anyOf");
            if let Value::Object(inner) = inner {
                for (k, val) in inner {
                    m.entry(k).or_insert(val);
                }
            }
            m.insert("nullable".into(), json!(true));
        }
    }
    // `oneOf` of unit variants (`const` or single-value `enum` each): a string enum.
    if let Some(Value::Array(one)) = m.get("oneOf").cloned() {
        let values: Option<Vec<Value>> = one
            .iter()
            .map(|s| {
                s.get("const").cloned().or_else(|| {
                    s.get("enum")
                        .and_then(Value::as_array)
                        .filter(|e| e.len() == 1)
                        .map(|e| e[0].clone())
                })
            })
            .collect();
        if let Some(values) = values {
            m.remove("oneOf");
            m.insert("type".into(), json!("string"));
            m.insert("enum".into(), Value::Array(values));
        }
    }
    if let Some(c) = m.remove("const") {
        m.insert("enum".into(), json!([c]));
    }
    // `type: [T, "null"]`: T, nullable.
    if let Some(Value::Array(types)) = m.get("type").cloned() {
        let rest: Vec<Value> = types.into_iter().filter(|t| t != "null").collect();
        if rest.len() == 1 {
            m.insert("type".into(), rest[0].clone());
            m.insert("nullable".into(), json!(true));
        }
    }
    if let Some(Value::Array(e)) = m.get_mut("enum") {
        e.retain(|x| !x.is_null());
    }
    for (_, child) in m.iter_mut() {
        match child {
            Value::Object(_) => structural(child),
            Value::Array(items) => items.iter_mut().for_each(structural),
            _ => {}
        }
    }
    // Object keys that are themselves schemas were walked above; `properties` holds a map
    // of schemas, which the generic walk treated as one schema: walk its values explicitly.
    if let Some(Value::Object(props)) = m.get_mut("properties") {
        for (_, p) in props.iter_mut() {
            structural(p);
        }
    }
}

fn is_nullable_only(s: &Value) -> bool {
    s.get("nullable") == Some(&json!(true)) && s.as_object().is_some_and(|m| m.len() == 1)
}

/// Everything a CRD is built from (filled in by the derive).
#[doc(hidden)]
pub struct Definition<'a> {
    pub group: &'a str,
    pub version: &'a str,
    pub kind: &'a str,
    pub plural: &'a str,
    pub singular: &'a str,
    pub namespaced: bool,
    pub short_names: &'a [&'a str],
    pub categories: &'a [&'a str],
    /// Printer columns as JSON (`{"name":..,"type":..,"jsonPath":..}`).
    pub printer_columns: &'a [&'a str],
    pub status: bool,
    /// The scale subresource as JSON (`{"specReplicasPath":..,"statusReplicasPath":..}`).
    pub scale: Option<&'a str>,
    pub spec_schema: Value,
    pub status_schema: Option<Value>,
}

/// Builds the CustomResourceDefinition. Malformed printer-column or scale JSON in the derive
/// attributes is a programming error and panics with the offending text.
#[doc(hidden)]
pub fn definition(d: &Definition<'_>) -> CustomResourceDefinition {
    let mut properties = Map::new();
    properties.insert("spec".into(), d.spec_schema.clone());
    if let Some(s) = &d.status_schema {
        properties.insert("status".into(), s.clone());
    }
    let mut subresources = Map::new();
    if d.status {
        subresources.insert("status".into(), json!({}));
    }
    if let Some(scale) = d.scale {
        let v: Value = serde_json::from_str(scale)
            .unwrap_or_else(|e| panic!("resource scale {scale:?} is not JSON: {e}"));
        subresources.insert("scale".into(), v);
    }
    let columns: Vec<Value> = d
        .printer_columns
        .iter()
        .map(|c| {
            serde_json::from_str(c)
                .unwrap_or_else(|e| panic!("resource printcolumn {c:?} is not JSON: {e}"))
        })
        .collect();
    let mut version = json!({
        "name": d.version,
        "served": true,
        "storage": true,
        "schema": {"openAPIV3Schema": {
            "type": "object",
            "description": format!("{} is a custom resource of {}.", d.kind, d.group),
            "properties": properties,
            "required": ["spec"],
        }},
    });
    if !subresources.is_empty() {
        version["subresources"] = Value::Object(subresources);
    }
    if !columns.is_empty() {
        version["additionalPrinterColumns"] = Value::Array(columns);
    }
    let mut names = json!({
        "plural": d.plural,
        "singular": d.singular,
        "kind": d.kind,
        "listKind": format!("{}List", d.kind),
    });
    if !d.short_names.is_empty() {
        names["shortNames"] = json!(d.short_names);
    }
    if !d.categories.is_empty() {
        names["categories"] = json!(d.categories);
    }
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{}.{}", d.plural, d.group)},
        "spec": {
            "group": d.group,
            "scope": if d.namespaced { "Namespaced" } else { "Cluster" },
            "names": names,
            "versions": [version],
        },
    });
    serde_json::from_value(crd).expect("a CRD built from valid parts decodes")
}

#[cfg(test)]
mod tests {
    use super::*;
    use schemars::JsonSchema;

    #[allow(dead_code)]
    #[derive(JsonSchema)]
    #[serde(rename_all = "camelCase")]
    struct Target {
        name: String,
        weight: Option<u32>,
    }

    #[allow(dead_code)]
    #[derive(JsonSchema)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    /// A spec.
    struct Spec {
        /// When to run.
        schedule: String,
        retention_days: Option<i64>,
        target: Option<Target>,
        targets: Vec<Target>,
        labels: std::collections::BTreeMap<String, String>,
    }

    fn no_refs(v: &Value) -> bool {
        match v {
            Value::Object(m) => !m.contains_key("$ref") && m.values().all(no_refs),
            Value::Array(a) => a.iter().all(no_refs),
            _ => true,
        }
    }

    #[test]
    fn schemas_are_structural() {
        let s = schema_of::<Spec>();
        assert!(no_refs(&s), "{s:#}");
        assert_eq!(s["type"], "object");
        assert!(s.get("additionalProperties").is_none());
        let p = &s["properties"];
        assert_eq!(p["schedule"]["type"], "string");
        assert_eq!(p["schedule"]["description"], "When to run.");
        assert_eq!(p["retentionDays"]["type"], "integer");
        assert_eq!(p["retentionDays"]["nullable"], true);
        assert_eq!(p["target"]["type"], "object");
        assert_eq!(p["target"]["nullable"], true);
        assert_eq!(p["target"]["properties"]["name"]["type"], "string");
        assert_eq!(
            p["targets"]["items"]["properties"]["weight"]["nullable"],
            true
        );
        assert_eq!(p["labels"]["additionalProperties"]["type"], "string");
        let mut required: Vec<&str> = s["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        required.sort();
        assert_eq!(required, vec!["labels", "schedule", "targets"]);
    }

    #[test]
    fn definitions_carry_names_columns_and_subresources() {
        let crd = definition(&Definition {
            group: "example.com",
            version: "v1",
            kind: "CronBackup",
            plural: "cronbackups",
            singular: "cronbackup",
            namespaced: true,
            short_names: &["cb"],
            categories: &["all"],
            printer_columns: &[
                r#"{"name":"Schedule","type":"string","jsonPath":".spec.schedule"}"#,
            ],
            status: true,
            scale: None,
            spec_schema: schema_of::<Spec>(),
            status_schema: Some(json!({"type": "object"})),
        });
        let v = serde_json::to_value(&crd).unwrap();
        assert_eq!(v["metadata"]["name"], "cronbackups.example.com");
        assert_eq!(v["spec"]["scope"], "Namespaced");
        assert_eq!(v["spec"]["names"]["shortNames"], json!(["cb"]));
        let ver = &v["spec"]["versions"][0];
        assert_eq!(ver["subresources"]["status"], json!({}));
        assert_eq!(
            ver["additionalPrinterColumns"][0]["jsonPath"],
            ".spec.schedule"
        );
        assert_eq!(
            ver["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["schedule"]
                ["type"],
            "string"
        );
    }
}
