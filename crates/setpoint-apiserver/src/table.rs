//! `meta.k8s.io/v1` Table responses for `kubectl get`, built from the kind's printer columns.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{json, Value};

use crate::registry::ResourceDef;

/// Builds a Table of `objects`. `with_columns` is false for every watch event after the first
/// (only the first carries the column definitions). `includeObject` chooses what each row's
/// `object` holds: `Metadata` (default, a PartialObjectMetadata), `Object`, or `None`.
pub fn table(
    res: &ResourceDef,
    objects: &[Arc<Value>],
    resource_version: &str,
    continue_token: Option<&str>,
    query: &HashMap<String, String>,
    with_columns: bool,
) -> Value {
    let now = chrono::Utc::now();
    let include = query
        .get("includeObject")
        .map(String::as_str)
        .unwrap_or("Metadata");
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let cells = match &res.custom {
                Some(c) => crate::crd::columns::cells(c, o, now),
                None => setpoint_kinds::tables::cells(&res.group, &res.kind, o, now),
            };
            let object = match include {
                "Object" => (**o).clone(),
                "None" => Value::Null,
                _ => json!({
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": o.get("metadata").cloned().unwrap_or_else(|| json!({})),
                }),
            };
            json!({"cells": cells, "object": object})
        })
        .collect();
    let mut metadata = json!({"resourceVersion": resource_version});
    if let Some(c) = continue_token {
        metadata["continue"] = json!(c);
    }
    let mut t = json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": metadata});
    if with_columns {
        let cols: Vec<Value> = match &res.custom {
            Some(c) => crate::crd::columns::columns(c),
            None => setpoint_kinds::tables::columns(&res.group, &res.kind)
                .into_iter()
                .map(|c| {
                    json!({"name": c.name, "type": c.type_, "format": c.format, "description": c.description, "priority": c.priority})
                })
                .collect(),
        };
        t["columnDefinitions"] = Value::Array(cols);
    }
    t["rows"] = Value::Array(rows);
    t
}
