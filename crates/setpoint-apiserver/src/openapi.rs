//! OpenAPI v3 documents: a root index and one document per group/version.
//!
//! Each document lists every served path with its operations, the
//! `x-kubernetes-group-version-kind` of each kind and the `fieldValidation` parameter, which is
//! what kubectl reads to decide that the server validates fields itself (so `kubectl create -f`
//! and `apply -f` send `fieldValidation=Strict`). Full schemas come with the apply work.

use serde_json::{json, Map, Value};

use crate::registry::ResourceDef;
use crate::server::ApiServer;

/// Serves `/openapi/v3` (the index) and `/openapi/v3/<api/v1 | apis/g/v>`.
pub fn v3(server: &ApiServer, path: &str) -> Option<Value> {
    let rest = path
        .trim_start_matches("/openapi/v3")
        .trim_start_matches('/');
    if rest.is_empty() {
        let mut paths = Map::new();
        for (g, versions) in server.registry.groups() {
            for v in versions {
                let key = if g.is_empty() {
                    format!("api/{v}")
                } else {
                    format!("apis/{g}/{v}")
                };
                let hash = doc_hash(&group_version_doc(server, &g, &v));
                paths.insert(
                    key.clone(),
                    json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash={hash}")}),
                );
            }
        }
        return Some(json!({"paths": Value::Object(paths)}));
    }
    let (group, version) = match rest.split('/').collect::<Vec<_>>().as_slice() {
        ["api", v] => (String::new(), v.to_string()),
        ["apis", g, v] => (g.to_string(), v.to_string()),
        _ => return None,
    };
    if !server
        .registry
        .all()
        .iter()
        .any(|r| r.group == group && r.version == version)
    {
        return None;
    }
    Some(group_version_doc(server, &group, &version))
}

fn doc_hash(doc: &Value) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in doc.to_string().bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    format!("{h:016X}")
}

fn param(name: &str, description: &str) -> Value {
    json!({"name": name, "in": "query", "description": description, "schema": {"type": "string", "uniqueItems": true}})
}

fn write_params() -> Vec<Value> {
    vec![
        param(
            "dryRun",
            "When present, the write is validated but not persisted. Valid value: All.",
        ),
        param("fieldManager", "The name of the actor making the change."),
        param(
            "fieldValidation",
            "What to do with unknown or duplicate fields: Ignore, Warn (default) or Strict.",
        ),
    ]
}

fn gvk(r: &ResourceDef) -> Value {
    json!({"group": r.group, "version": r.version, "kind": r.kind})
}

fn schema_ref(r: &ResourceDef) -> Value {
    json!({"$ref": format!("#/components/schemas/{}", schema_name(r))})
}

fn schema_name(r: &ResourceDef) -> String {
    let g = if r.group.is_empty() {
        "core".to_string()
    } else {
        r.group.clone()
    };
    format!("io.setpoint.{g}.{}.{}", r.version, r.kind)
}

fn ok_response(r: &ResourceDef) -> Value {
    json!({"200": {"description": "OK", "content": {"application/json": {"schema": schema_ref(r)}}}})
}

fn group_version_doc(server: &ApiServer, group: &str, version: &str) -> Value {
    let mut paths = Map::new();
    let mut schemas = Map::new();
    for r in server
        .registry
        .all()
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let base = if r.group.is_empty() {
            format!("/api/{}", r.version)
        } else {
            format!("/apis/{}/{}", r.group, r.version)
        };
        let collection = if r.namespaced {
            format!("{base}/namespaces/{{namespace}}/{}", r.plural)
        } else {
            format!("{base}/{}", r.plural)
        };
        let item = format!("{collection}/{{name}}");
        let body = |types: &[&str]| {
            let mut content = Map::new();
            for t in types {
                content.insert((*t).to_string(), json!({"schema": schema_ref(r)}));
            }
            json!({"content": Value::Object(content)})
        };
        let op = |action: &str, extra: Value| {
            let mut o = json!({
                "operationId": format!("{action}{}", r.kind),
                "x-kubernetes-action": action,
                "x-kubernetes-group-version-kind": gvk(r),
                "responses": ok_response(r),
            });
            if let Value::Object(m) = extra {
                for (k, v) in m {
                    o[k] = v;
                }
            }
            o
        };
        paths.insert(
            collection.clone(),
            json!({
                "get": op("list", json!({})),
                "post": op("post", json!({"parameters": write_params(), "requestBody": body(&["application/json", "application/yaml"])})),
                "delete": op("deletecollection", json!({})),
            }),
        );
        paths.insert(
            item.clone(),
            json!({
                "get": op("get", json!({})),
                "put": op("put", json!({"parameters": write_params(), "requestBody": body(&["application/json", "application/yaml"])})),
                // Strategic merge patch is left out on purpose: kubectl then computes it from
                // its compiled-in types, which is right for built-in kinds.
                "patch": op("patch", json!({
                    "parameters": write_params().into_iter().chain([param("force", "Force an apply, taking ownership of conflicting fields.")]).collect::<Vec<_>>(),
                    "requestBody": body(&["application/json-patch+json", "application/merge-patch+json", "application/apply-patch+yaml"]),
                })),
                "delete": op("delete", json!({"parameters": [param("dryRun", "When present, the delete is validated but not performed.")]})),
            }),
        );
        for s in r.subresources() {
            paths.insert(
                format!("{item}/{}", s.name),
                json!({"get": op("get", json!({}))}),
            );
        }
        schemas.insert(
            schema_name(r),
            json!({"type": "object", "x-kubernetes-group-version-kind": [gvk(r)], "x-kubernetes-preserve-unknown-fields": true}),
        );
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": Value::Object(paths),
        "components": {"schemas": Value::Object(schemas)},
    })
}
