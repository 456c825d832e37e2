//! `kubectl get` columns of custom resources: the CRD version's `additionalPrinterColumns`,
//! evaluated with the JSONPath subset CRDs use (`.spec.x`, `.items[0]`, `.list[*].name`,
//! `.conditions[?(@.type=="Ready")].status`). Without printer columns a custom resource shows
//! its name and age, like Kubernetes.

use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use super::CustomResource;

/// The columns of a custom resource's Table (always starting with the name).
pub fn columns(custom: &CustomResource) -> Vec<Value> {
    let mut out = vec![json!({
        "name": "Name", "type": "string", "format": "name", "priority": 0,
        "description": "Name must be unique within a namespace."
    })];
    if custom.columns.is_empty() {
        out.push(json!({"name": "Age", "type": "date", "format": "", "priority": 0,
            "description": "CreationTimestamp is a timestamp representing the server time when this object was created."}));
        return out;
    }
    for c in &custom.columns {
        out.push(json!({
            "name": c.get("name").cloned().unwrap_or_else(|| json!("")),
            "type": c.get("type").cloned().unwrap_or_else(|| json!("string")),
            "format": c.get("format").cloned().unwrap_or_else(|| json!("")),
            "description": c.get("description").cloned().unwrap_or_else(|| json!("")),
            "priority": c.get("priority").cloned().unwrap_or_else(|| json!(0)),
        }));
    }
    out
}

/// The cells of one row, one per [`columns`] entry.
pub fn cells(custom: &CustomResource, obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let name = obj.pointer("/metadata/name").cloned().unwrap_or(json!(""));
    let mut out = vec![name];
    if custom.columns.is_empty() {
        let created = obj.pointer("/metadata/creationTimestamp").cloned();
        out.push(cell("date", created.as_ref(), now));
        return out;
    }
    for c in &custom.columns {
        let path = c.get("jsonPath").and_then(Value::as_str).unwrap_or("");
        let type_ = c.get("type").and_then(Value::as_str).unwrap_or("string");
        let found = evaluate(path, obj);
        let value = match found.len() {
            0 => None,
            1 => Some(found[0].clone()),
            // Several results print comma-separated, as kubectl's JSONPath printer does.
            _ => Some(Value::String(
                found.iter().map(plain).collect::<Vec<_>>().join(","),
            )),
        };
        out.push(cell(type_, value.as_ref(), now));
    }
    out
}

fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A cell of `type_`; dates are shown as ages, missing values as empty cells (`<none>` in
/// kubectl).
fn cell(type_: &str, v: Option<&Value>, now: DateTime<Utc>) -> Value {
    let Some(v) = v else {
        return Value::Null;
    };
    match type_ {
        "date" => match v
            .as_str()
            .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        {
            Some(t) => json!(setpoint_kinds::tables::human_duration(
                now - t.with_timezone(&Utc)
            )),
            None => json!(plain(v)),
        },
        "integer" => v.as_i64().map(Value::from).unwrap_or(Value::Null),
        "number" => v.as_f64().map(Value::from).unwrap_or(Value::Null),
        "boolean" => v.as_bool().map(Value::from).unwrap_or(Value::Null),
        _ => json!(plain(v)),
    }
}

/// One step of a parsed JSONPath.
#[derive(Debug, PartialEq)]
enum Step {
    Field(String),
    Index(usize),
    All,
    /// `[?(@.key=="value")]` (also `@.a.b`).
    Filter(Vec<String>, String),
}

fn parse(path: &str) -> Option<Vec<Step>> {
    let p = path.trim();
    let p = p
        .strip_prefix('{')
        .and_then(|p| p.strip_suffix('}'))
        .unwrap_or(p);
    let p = p.strip_prefix('$').unwrap_or(p);
    let mut steps = Vec::new();
    let mut rest = p;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            if end > 0 {
                steps.push(Step::Field(r[..end].to_string()));
            }
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']')?;
            // A filter may contain ']' only inside quotes, which CRD paths don't use.
            let inner = &r[..end];
            rest = &r[end + 1..];
            if inner == "*" {
                steps.push(Step::All);
            } else if let Ok(i) = inner.parse() {
                steps.push(Step::Index(i));
            } else if let Some(f) = inner.strip_prefix("?(@.").and_then(|f| f.strip_suffix(')')) {
                let (lhs, rhs) = f.split_once("==")?;
                let value = rhs.trim().trim_matches(|c| c == '"' || c == '\'');
                steps.push(Step::Filter(
                    lhs.trim().split('.').map(String::from).collect(),
                    value.to_string(),
                ));
            } else {
                let key = inner.trim_matches(|c| c == '"' || c == '\'');
                steps.push(Step::Field(key.to_string()));
            }
        } else {
            return None;
        }
    }
    Some(steps)
}

/// Every value `path` selects in `obj` (none when the path is malformed or finds nothing).
pub fn evaluate(path: &str, obj: &Value) -> Vec<Value> {
    let Some(steps) = parse(path) else {
        return Vec::new();
    };
    let mut current = vec![obj];
    for step in &steps {
        let mut next = Vec::new();
        for v in current {
            match step {
                Step::Field(k) => next.extend(v.get(k)),
                Step::Index(i) => next.extend(v.get(*i)),
                Step::All => match v {
                    Value::Array(a) => next.extend(a.iter()),
                    Value::Object(m) => next.extend(m.values()),
                    _ => {}
                },
                Step::Filter(keys, want) => {
                    if let Value::Array(a) = v {
                        next.extend(a.iter().filter(|item| {
                            keys.iter()
                                .try_fold(*item, |x, k| x.get(k))
                                .is_some_and(|x| plain(x) == *want)
                        }));
                    }
                }
            }
        }
        current = next;
    }
    current.into_iter().cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj() -> Value {
        json!({"metadata": {"name": "b", "creationTimestamp": "2026-01-01T00:00:00Z"},
               "spec": {"schedule": "0 2 * * *", "replicas": 3, "targets": [{"name": "a"}, {"name": "b"}]},
               "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "Synced", "status": "False"}]}})
    }

    #[test]
    fn json_paths() {
        let o = obj();
        assert_eq!(evaluate(".spec.schedule", &o), vec![json!("0 2 * * *")]);
        assert_eq!(evaluate("{.spec.replicas}", &o), vec![json!(3)]);
        assert_eq!(evaluate(".spec.targets[1].name", &o), vec![json!("b")]);
        assert_eq!(
            evaluate(".spec.targets[*].name", &o),
            vec![json!("a"), json!("b")]
        );
        assert_eq!(
            evaluate(".status.conditions[?(@.type==\"Ready\")].status", &o),
            vec![json!("True")]
        );
        assert!(evaluate(".spec.missing", &o).is_empty());
        assert!(
            evaluate("spec", &o).is_empty(),
            "malformed paths find nothing"
        );
    }

    #[test]
    fn cells_follow_column_types() {
        let custom = CustomResource {
            crd_name: "x".into(),
            storage_version: "v1".into(),
            schema: None,
            columns: vec![
                json!({"name": "Schedule", "type": "string", "jsonPath": ".spec.schedule"}),
                json!({"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"}),
                json!({"name": "Targets", "type": "string", "jsonPath": ".spec.targets[*].name"}),
                json!({"name": "Created", "type": "date", "jsonPath": ".metadata.creationTimestamp"}),
                json!({"name": "Missing", "type": "string", "jsonPath": ".status.nothing", "priority": 1}),
            ],
            scale: None,
            terminating: false,
            has_defaults: false,
            webhook: None,
        };
        let now = DateTime::parse_from_rfc3339("2026-01-03T00:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let c = cells(&custom, &obj(), now);
        assert_eq!(
            c,
            vec![
                json!("b"),
                json!("0 2 * * *"),
                json!(3),
                json!("a,b"),
                json!("2d"),
                Value::Null
            ]
        );
        let cols = columns(&custom);
        assert_eq!(cols.len(), 6);
        assert_eq!(cols[5]["priority"], 1);
        let plain = CustomResource {
            columns: vec![],
            ..custom
        };
        assert_eq!(columns(&plain)[1]["name"], "Age");
        assert_eq!(cells(&plain, &obj(), now)[1], json!("2d"));
    }
}
