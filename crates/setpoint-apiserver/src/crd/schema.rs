//! Structural schemas (`openAPIV3Schema` of a CustomResourceDefinition version): defaulting,
//! pruning and validation of custom objects, as the Kubernetes API server applies them.
//!
//! Order on every write: [`default`] fills missing fields that declare a `default`, [`prune`]
//! drops fields the schema does not declare (unless `x-kubernetes-preserve-unknown-fields`),
//! then [`validate`] reports every violation with its field path. The root's `apiVersion`,
//! `kind` and `metadata` are the server's and never pruned or schema-checked.

use std::collections::HashSet;

use serde_json::{Map, Value};
use setpoint_api::Cause;

fn schema_type(schema: &Value) -> &str {
    schema.get("type").and_then(Value::as_str).unwrap_or("")
}

fn flag(schema: &Value, key: &str) -> bool {
    schema.get(key).and_then(Value::as_bool) == Some(true)
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// Whether the root-level field is the server's (never defaulted, pruned or validated by the
/// schema).
fn is_server_field(path: &str, key: &str) -> bool {
    path.is_empty() && matches!(key, "apiVersion" | "kind" | "metadata")
}

/// Fills in `default`s of missing object properties, recursively (array items too).
pub fn default(schema: &Value, value: &mut Value) {
    default_at(schema, value, "");
}

fn default_at(schema: &Value, value: &mut Value, path: &str) {
    match value {
        Value::Object(map) => {
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (key, sub) in props {
                    if is_server_field(path, key) {
                        continue;
                    }
                    if !map.contains_key(key) {
                        if let Some(d) = sub.get("default") {
                            map.insert(key.clone(), d.clone());
                        }
                    }
                }
                for (key, sub) in props {
                    if is_server_field(path, key) {
                        continue;
                    }
                    if let Some(v) = map.get_mut(key) {
                        default_at(sub, v, &join(path, key));
                    }
                }
            } else if let Some(sub) = schema.get("additionalProperties").filter(|s| s.is_object()) {
                for (key, v) in map.iter_mut() {
                    default_at(sub, v, &join(path, key));
                }
            }
        }
        Value::Array(items) => {
            if let Some(sub) = schema.get("items") {
                for v in items.iter_mut() {
                    default_at(sub, v, path);
                }
            }
        }
        _ => {}
    }
}

/// Drops fields the schema does not declare; returns their paths (for `fieldValidation`).
pub fn prune(schema: &Value, value: &mut Value) -> Vec<String> {
    let mut pruned = Vec::new();
    prune_at(schema, value, "", &mut pruned);
    pruned
}

fn prune_at(schema: &Value, value: &mut Value, path: &str, pruned: &mut Vec<String>) {
    let preserve = flag(schema, "x-kubernetes-preserve-unknown-fields");
    let embedded = flag(schema, "x-kubernetes-embedded-resource");
    match value {
        Value::Object(map) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties");
            let keys: Vec<String> = map.keys().cloned().collect();
            for key in keys {
                if is_server_field(path, &key) {
                    continue;
                }
                if embedded && matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                let child = join(path, &key);
                let sub = props
                    .and_then(|p| p.get(&key))
                    .or_else(|| additional.filter(|a| a.is_object()));
                match sub {
                    Some(sub) => {
                        if let Some(v) = map.get_mut(&key) {
                            prune_at(sub, v, &child, pruned);
                        }
                    }
                    None if preserve || additional == Some(&Value::Bool(true)) => {}
                    None => {
                        map.remove(&key);
                        pruned.push(child);
                    }
                }
            }
        }
        Value::Array(items) => {
            if let Some(sub) = schema.get("items") {
                for (i, v) in items.iter_mut().enumerate() {
                    prune_at(sub, v, &format!("{path}[{i}]"), pruned);
                }
            }
        }
        _ => {}
    }
}

fn json_type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn short(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Every violation of `schema` by `value`, one cause per field path.
pub fn validate(schema: &Value, value: &Value) -> Vec<Cause> {
    validate_update(schema, value, None)
}

/// Like [`validate`], for an update from `old` (transition rules see `oldSelf`).
pub fn validate_update(schema: &Value, value: &Value, old: Option<&Value>) -> Vec<Cause> {
    let mut causes = Vec::new();
    // One budget for all of the object's rules, as upstream gives each request.
    let mut budget = crate::cel::Budget::per_request();
    validate_at(schema, value, old, "", &mut causes, &mut budget);
    causes
}

fn type_ok(schema: &Value, value: &Value) -> bool {
    if flag(schema, "x-kubernetes-int-or-string") {
        return matches!(json_type_name(value), "integer" | "string");
    }
    match schema_type(schema) {
        "" => true,
        "number" => value.is_number(),
        "integer" => json_type_name(value) == "integer",
        t => json_type_name(value) == t,
    }
}

fn validate_at(
    schema: &Value,
    value: &Value,
    old: Option<&Value>,
    path: &str,
    causes: &mut Vec<Cause>,
    budget: &mut crate::cel::Budget,
) {
    let field = if path.is_empty() { "<root>" } else { path };
    if value.is_null() {
        if !flag(schema, "nullable") && !schema_type(schema).is_empty() {
            causes.push(Cause::invalid(
                field,
                value,
                &format!(
                    "{field} in body must be of type {}: \"null\"",
                    schema_type(schema)
                ),
            ));
        }
        return;
    }
    if !type_ok(schema, value) {
        let wanted = if flag(schema, "x-kubernetes-int-or-string") {
            "integer or string".to_string()
        } else {
            schema_type(schema).to_string()
        };
        causes.push(Cause::invalid(
            field,
            value,
            &format!(
                "{field} in body must be of type {wanted}: \"{}\"",
                json_type_name(value)
            ),
        ));
        return;
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array) {
        if !options.contains(value) {
            let supported: Vec<String> = options.iter().map(short).collect();
            let refs: Vec<&str> = supported.iter().map(String::as_str).collect();
            causes.push(Cause::not_supported(field, value, &refs));
        }
    }
    match value {
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(0.0);
            let exclusive_min = flag(schema, "exclusiveMinimum");
            let exclusive_max = flag(schema, "exclusiveMaximum");
            if let Some(min) = schema.get("minimum").and_then(Value::as_f64) {
                if x < min || (exclusive_min && x == min) {
                    let op = if exclusive_min {
                        "greater than"
                    } else {
                        "greater than or equal to"
                    };
                    causes.push(Cause::invalid(
                        field,
                        value,
                        &format!("{field} in body should be {op} {min}"),
                    ));
                }
            }
            if let Some(max) = schema.get("maximum").and_then(Value::as_f64) {
                if x > max || (exclusive_max && x == max) {
                    let op = if exclusive_max {
                        "less than"
                    } else {
                        "less than or equal to"
                    };
                    causes.push(Cause::invalid(
                        field,
                        value,
                        &format!("{field} in body should be {op} {max}"),
                    ));
                }
            }
            if let Some(m) = schema.get("multipleOf").and_then(Value::as_f64) {
                if m > 0.0 && (x / m).fract().abs() > 1e-9 {
                    causes.push(Cause::invalid(
                        field,
                        value,
                        &format!("{field} in body should be a multiple of {m}"),
                    ));
                }
            }
            if schema.get("format").and_then(Value::as_str) == Some("int32")
                && n.as_i64().is_some_and(|i| i32::try_from(i).is_err())
            {
                causes.push(Cause::invalid(
                    field,
                    value,
                    &format!("{field} in body must be of type int32"),
                ));
            }
        }
        Value::String(s) => {
            let len = s.chars().count() as u64;
            if let Some(min) = schema.get("minLength").and_then(Value::as_u64) {
                if len < min {
                    causes.push(Cause::invalid(
                        field,
                        value,
                        &format!("{field} in body should be at least {min} chars long"),
                    ));
                }
            }
            if let Some(max) = schema.get("maxLength").and_then(Value::as_u64) {
                if len > max {
                    causes.push(Cause::too_long(field, max as usize));
                }
            }
            if let Some(p) = schema.get("pattern").and_then(Value::as_str) {
                if let Ok(re) = regex::Regex::new(p) {
                    if !re.is_match(s) {
                        causes.push(Cause::invalid(
                            field,
                            value,
                            &format!("{field} in body should match '{p}'"),
                        ));
                    }
                }
            }
            if let Some(format) = schema.get("format").and_then(Value::as_str) {
                if let Some(why) = check_format(format, s) {
                    causes.push(Cause::invalid(
                        field,
                        value,
                        &format!("{field} in body must be of type {format}: {why}"),
                    ));
                }
            }
        }
        Value::Array(items) => {
            let n = items.len() as u64;
            if let Some(min) = schema.get("minItems").and_then(Value::as_u64) {
                if n < min {
                    causes.push(Cause::invalid(
                        field,
                        value,
                        &format!("{field} in body should have at least {min} items"),
                    ));
                }
            }
            if let Some(max) = schema.get("maxItems").and_then(Value::as_u64) {
                if n > max {
                    causes.push(Cause::new(
                        "FieldValueTooMany",
                        field,
                        format!("Too many: {n}: must have at most {max} items"),
                    ));
                }
            }
            let list_type = schema.get("x-kubernetes-list-type").and_then(Value::as_str);
            if flag(schema, "uniqueItems") || list_type == Some("set") {
                let mut seen = HashSet::new();
                for (i, v) in items.iter().enumerate() {
                    if !seen.insert(v.to_string()) {
                        causes.push(Cause::duplicate(format!("{path}[{i}]"), v));
                    }
                }
            }
            if list_type == Some("map") {
                let keys: Vec<&str> = schema
                    .get("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array)
                    .map(|ks| ks.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let mut seen = HashSet::new();
                for (i, v) in items.iter().enumerate() {
                    let key: Vec<String> = keys
                        .iter()
                        .map(|k| v.get(*k).map(Value::to_string).unwrap_or_default())
                        .collect();
                    if !seen.insert(key) {
                        let shown: Map<String, Value> = keys
                            .iter()
                            .filter_map(|k| v.get(*k).map(|x| (k.to_string(), x.clone())))
                            .collect();
                        causes.push(Cause::duplicate(
                            format!("{path}[{i}]"),
                            &Value::Object(shown),
                        ));
                    }
                }
            }
            if let Some(sub) = schema.get("items") {
                for (i, v) in items.iter().enumerate() {
                    validate_at(sub, v, None, &format!("{path}[{i}]"), causes, budget);
                }
            }
        }
        Value::Object(map) => {
            if let Some(required) = schema.get("required").and_then(Value::as_array) {
                for r in required.iter().filter_map(Value::as_str) {
                    if !map.contains_key(r) && !is_server_field(path, r) {
                        causes.push(Cause::required(join(path, r), ""));
                    }
                }
            }
            let n = map.len() as u64;
            if let Some(min) = schema.get("minProperties").and_then(Value::as_u64) {
                if n < min {
                    causes.push(Cause::invalid(
                        field,
                        value,
                        &format!("{field} in body should have at least {min} properties"),
                    ));
                }
            }
            if let Some(max) = schema.get("maxProperties").and_then(Value::as_u64) {
                if n > max {
                    causes.push(Cause::invalid(
                        field,
                        value,
                        &format!("{field} in body should have at most {max} properties"),
                    ));
                }
            }
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            for (key, v) in map {
                if is_server_field(path, key) {
                    continue;
                }
                if let Some(sub) = props.and_then(|p| p.get(key)).or(additional) {
                    validate_at(
                        sub,
                        v,
                        old.and_then(|o| o.get(key)),
                        &join(path, key),
                        causes,
                        budget,
                    );
                }
            }
        }
        Value::Bool(_) | Value::Null => {}
    }
    for (key, all) in [("allOf", true), ("anyOf", false), ("oneOf", false)] {
        let Some(subs) = schema.get(key).and_then(Value::as_array) else {
            continue;
        };
        let results: Vec<Vec<Cause>> = subs
            .iter()
            .map(|s| {
                let mut c = Vec::new();
                validate_at(s, value, old, path, &mut c, budget);
                c
            })
            .collect();
        let passing = results.iter().filter(|c| c.is_empty()).count();
        match key {
            "allOf" if all => causes.extend(results.into_iter().flatten()),
            "anyOf" if passing == 0 => causes.push(Cause::invalid(
                field,
                value,
                &format!("{field} in body must match at least one schema (anyOf)"),
            )),
            "oneOf" if passing != 1 => causes.push(Cause::invalid(
                field,
                value,
                &format!("{field} in body must match exactly one schema (oneOf)"),
            )),
            _ => {}
        }
    }
    causes.extend(super::cel::check_within(schema, value, old, path, budget));
    if let Some(not) = schema.get("not") {
        let mut c = Vec::new();
        validate_at(not, value, old, path, &mut c, budget);
        if c.is_empty() {
            causes.push(Cause::invalid(
                field,
                value,
                &format!("{field} in body must not match the schema (not)"),
            ));
        }
    }
}

/// Why `s` is not valid in `format`, for the formats Kubernetes checks; unknown formats pass.
fn check_format(format: &str, s: &str) -> Option<&'static str> {
    let ok = match format {
        "date-time" | "datetime" => chrono::DateTime::parse_from_rfc3339(s).is_ok(),
        "date" => chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d").is_ok(),
        "uuid" => uuid::Uuid::parse_str(s).is_ok(),
        "ipv4" => s.parse::<std::net::Ipv4Addr>().is_ok(),
        "ipv6" => s.parse::<std::net::Ipv6Addr>().is_ok(),
        "byte" => {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.decode(s).is_ok()
        }
        _ => true,
    };
    (!ok).then_some("invalid format")
}

/// Checks that a CRD's schema is one the server can use; returns the problems, by path under
/// `prefix` (e.g. `spec.versions[0].schema.openAPIV3Schema`).
pub fn check_schema(schema: &Value, prefix: &str) -> Vec<Cause> {
    let mut causes = Vec::new();
    let mut total = 0u64;
    check_schema_at(schema, prefix, 1, &mut total, &mut causes);
    if total > crate::cel::STATIC_ESTIMATED_CRD_COST_LIMIT {
        causes.push(Cause::forbidden(
            prefix,
            &crate::cel::cost::exceeds_budget_message(
                "x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema",
                total,
                crate::cel::STATIC_ESTIMATED_CRD_COST_LIMIT,
            ),
        ));
    }
    causes
}

/// Checks one schema node and those under it. `cardinality` is how many times the node's
/// rules can run for one object (the product of the length bounds of the lists and maps
/// above it); `total` sums each rule's estimated cost times that, for the CRD-wide limit.
fn check_schema_at(
    schema: &Value,
    path: &str,
    cardinality: u64,
    total: &mut u64,
    causes: &mut Vec<Cause>,
) {
    let Some(map) = schema.as_object() else {
        causes.push(Cause::invalid(path, schema, "must be an object"));
        return;
    };
    if let Some(t) = map.get("type") {
        let ok = t.as_str().is_some_and(|t| {
            matches!(
                t,
                "object" | "array" | "string" | "integer" | "number" | "boolean"
            )
        });
        if !ok {
            causes.push(Cause::not_supported(
                join(path, "type"),
                t,
                &["array", "boolean", "integer", "number", "object", "string"],
            ));
        }
    } else if path.ends_with("openAPIV3Schema") {
        causes.push(Cause::required(
            join(path, "type"),
            "must not be empty at the root",
        ));
    }
    if let Some(p) = map.get("pattern").and_then(Value::as_str) {
        if let Err(e) = regex::Regex::new(p) {
            causes.push(Cause::invalid(
                join(path, "pattern"),
                &Value::String(p.into()),
                &e.to_string(),
            ));
        }
    }
    let (rule_causes, cost) = super::cel::rule_errors(schema, path);
    causes.extend(rule_causes);
    *total = total.saturating_add(cost.saturating_mul(cardinality));
    if let Some(props) = map.get("properties").and_then(Value::as_object) {
        for (k, sub) in props {
            let sub_path = format!("{path}.properties[{k}]");
            check_schema_at(sub, &sub_path, cardinality, total, causes);
        }
    }
    let repeated = cardinality.saturating_mul(crate::cel::cost::cardinality_factor(
        &crate::cel::schema::Node::new(schema),
    ));
    if let Some(items) = map.get("items") {
        check_schema_at(items, &join(path, "items"), repeated, total, causes);
    }
    if let Some(a) = map.get("additionalProperties").filter(|a| a.is_object()) {
        let sub_path = join(path, "additionalProperties");
        check_schema_at(a, &sub_path, repeated, total, causes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["database"],
                    "properties": {
                        "schedule": {"type": "string", "default": "0 2 * * *", "minLength": 1},
                        "database": {"type": "string", "pattern": "^[a-z][a-z0-9-]*$"},
                        "retentionDays": {"type": "integer", "default": 30, "minimum": 1, "maximum": 365},
                        "mode": {"type": "string", "enum": ["full", "incremental"]},
                        "port": {"x-kubernetes-int-or-string": true},
                        "tags": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set"},
                        "targets": {
                            "type": "array",
                            "x-kubernetes-list-type": "map",
                            "x-kubernetes-list-map-keys": ["name"],
                            "items": {"type": "object", "properties": {
                                "name": {"type": "string"},
                                "weight": {"type": "integer", "default": 1}
                            }}
                        },
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        "note": {"type": "string", "nullable": true}
                    }
                },
                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
            }
        })
    }

    #[test]
    fn defaults_fill_missing_fields_only() {
        let mut obj = json!({"apiVersion": "x/v1", "kind": "B", "metadata": {"name": "a"},
            "spec": {"database": "db", "retentionDays": 7, "targets": [{"name": "t"}]}});
        default(&schema(), &mut obj);
        assert_eq!(obj["spec"]["schedule"], "0 2 * * *");
        assert_eq!(obj["spec"]["retentionDays"], 7, "set values are kept");
        assert_eq!(
            obj["spec"]["targets"][0]["weight"], 1,
            "array items are defaulted"
        );
    }

    #[test]
    fn pruning_drops_undeclared_fields_but_keeps_preserved_ones() {
        let mut obj = json!({"apiVersion": "x/v1", "kind": "B", "metadata": {"name": "a", "labels": {"k": "v"}},
            "spec": {"database": "db", "bogus": 1, "labels": {"free": "form"},
                     "extra": {"anything": {"goes": true}}, "targets": [{"name": "t", "junk": 2}]},
            "status": {"kopf": {"progress": {}}},
            "top": "level"});
        let pruned = prune(&schema(), &mut obj);
        assert_eq!(
            pruned,
            vec![
                "spec.bogus".to_string(),
                "spec.targets[0].junk".into(),
                "top".into()
            ]
        );
        assert_eq!(obj["metadata"]["labels"]["k"], "v");
        assert_eq!(obj["spec"]["labels"]["free"], "form");
        assert_eq!(obj["spec"]["extra"]["anything"]["goes"], true);
        assert!(obj["status"]["kopf"].is_object());
    }

    fn fields(causes: &[Cause]) -> Vec<String> {
        causes.iter().map(|c| c.field.clone()).collect()
    }

    #[test]
    fn validation_reports_each_violation_by_path() {
        let obj = json!({"metadata": {"name": "a"}, "spec": {
            "schedule": "",
            "database": "Bad_Name",
            "retentionDays": 0,
            "mode": "partial",
            "port": 1.5,
            "tags": ["a", "a"],
            "targets": [{"name": "x"}, {"name": "x"}],
            "labels": {"k": 3},
            "note": null
        }});
        let causes = validate(&schema(), &obj);
        let f = fields(&causes);
        for want in [
            "spec.schedule",
            "spec.database",
            "spec.retentionDays",
            "spec.mode",
            "spec.port",
            "spec.tags[1]",
            "spec.targets[1]",
            "spec.labels.k",
        ] {
            assert!(f.contains(&want.to_string()), "missing {want} in {f:?}");
        }
        assert!(
            !f.contains(&"spec.note".to_string()),
            "nullable allows null"
        );
        let missing = validate(&schema(), &json!({"spec": {}}));
        assert_eq!(fields(&missing), vec!["spec.database"]);
        assert_eq!(missing[0].reason, "FieldValueRequired");
        let type_error = validate(
            &schema(),
            &json!({"spec": {"database": "d", "retentionDays": "many"}}),
        );
        assert!(
            type_error[0].message.contains("must be of type integer"),
            "{:?}",
            type_error[0]
        );
    }

    #[test]
    fn valid_objects_pass() {
        let obj = json!({"apiVersion": "x/v1", "kind": "B", "metadata": {"name": "a"},
            "spec": {"database": "db-1", "retentionDays": 30, "mode": "full", "port": "http",
                     "tags": ["a", "b"], "targets": [{"name": "x"}, {"name": "y"}]}});
        assert!(validate(&schema(), &obj).is_empty());
    }

    #[test]
    fn schema_checks_catch_bad_types_and_patterns() {
        let bad = json!({"type": "object", "properties": {
            "a": {"type": "strin"}, "b": {"type": "string", "pattern": "("}}});
        let causes = check_schema(&bad, "spec.versions[0].schema.openAPIV3Schema");
        assert_eq!(causes.len(), 2, "{causes:?}");
        assert!(check_schema(&schema(), "s.openAPIV3Schema").is_empty());
        assert_eq!(check_schema(&json!({}), "s.openAPIV3Schema").len(), 1);
    }

    /// Each rule is cheap, but a rule on items of unbounded lists of unbounded lists runs
    /// for every one of them: the CRD-wide total is over its limit until the lists are
    /// bounded.
    #[test]
    fn the_total_estimated_cost_of_all_rules_is_limited() {
        let rule = json!([{"rule": "self.a <= self.b"}]);
        let item = json!({"type": "object", "x-kubernetes-validations": rule,
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}});
        let unbounded = json!({"type": "object", "properties": {"grid": {"type": "array",
            "items": {"type": "array", "items": item}}}});
        let causes = check_schema(&unbounded, "s.openAPIV3Schema");
        assert_eq!(causes.len(), 1, "{causes:?}");
        assert_eq!(causes[0].field, "s.openAPIV3Schema");
        assert!(causes[0].message.starts_with(
            "Forbidden: x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema exceeds budget by factor of"
        ), "{}", causes[0].message);
        let bounded = json!({"type": "object", "properties": {"grid": {"type": "array",
            "maxItems": 100, "items": {"type": "array", "maxItems": 100, "items": item}}}});
        assert!(check_schema(&bounded, "s.openAPIV3Schema").is_empty());
    }
}
