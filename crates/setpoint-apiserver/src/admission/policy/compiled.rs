//! A ValidatingAdmissionPolicy compiled for admission: its CEL expressions as programs, its
//! match constraints, and what did not compile. Compiled once per policy `uid` and
//! `generation` and shared by every request until the policy changes.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use serde_json::Value;

use crate::cel::schema::Node;

/// A CEL program, or why its expression does not compile.
pub(super) type Program = Result<Arc<crate::cel::Program>, String>;

/// One expression of the policy with where it sits (`spec.validations[0].expression`).
pub(super) struct Expr {
    pub text: String,
    pub program: Program,
}

impl Expr {
    fn new(text: &str) -> Expr {
        Expr {
            text: text.to_string(),
            program: crate::cel::compile(text).map_err(|e| e.to_string()),
        }
    }
}

/// One of `spec.validations`.
pub(super) struct Validation {
    pub expr: Expr,
    pub message: String,
    pub message_expression: Option<Expr>,
    /// `Invalid` when the validation names none.
    pub reason: String,
}

/// One of `spec.auditAnnotations`.
pub(super) struct AuditAnnotation {
    pub key: String,
    pub value: Expr,
}

/// A policy ready to evaluate.
pub(super) struct Policy {
    pub name: String,
    /// `failurePolicy: Fail` (the default).
    pub fails_closed: bool,
    /// `spec.paramKind` as (`apiVersion`, `kind`).
    pub param_kind: Option<(String, String)>,
    /// `spec.matchConstraints`.
    pub constraints: Value,
    pub match_conditions: Vec<(String, Expr)>,
    pub variables: Vec<(String, Expr)>,
    pub validations: Vec<Validation>,
    pub audit_annotations: Vec<AuditAnnotation>,
}

impl Policy {
    /// Compiles `obj` (a ValidatingAdmissionPolicy).
    pub fn compile(obj: &Value) -> Policy {
        let spec = obj.get("spec").unwrap_or(&Value::Null);
        let text =
            |v: &Value, key: &str| v.get(key).and_then(Value::as_str).unwrap_or("").to_string();
        let items = |key: &str| {
            spec.get(key)
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        };
        let param_kind = spec
            .get("paramKind")
            .filter(|k| !k.is_null())
            .map(|k| (text(k, "apiVersion"), text(k, "kind")));
        let named = |key: &str| -> Vec<(String, Expr)> {
            items(key)
                .iter()
                .map(|c| (text(c, "name"), Expr::new(&text(c, "expression"))))
                .collect()
        };
        let validations = items("validations")
            .iter()
            .map(|v| Validation {
                expr: Expr::new(&text(v, "expression")),
                message: text(v, "message"),
                message_expression: Some(text(v, "messageExpression"))
                    .filter(|m| !m.is_empty())
                    .map(|m| Expr::new(&m)),
                reason: Some(text(v, "reason"))
                    .filter(|r| !r.is_empty())
                    .unwrap_or_else(|| "Invalid".into()),
            })
            .collect();
        let audit_annotations = items("auditAnnotations")
            .iter()
            .map(|a| AuditAnnotation {
                key: text(a, "key"),
                value: Expr::new(&text(a, "valueExpression")),
            })
            .collect();
        Policy {
            name: setpoint_api::meta::name(obj).to_string(),
            fails_closed: spec.get("failurePolicy").and_then(Value::as_str) != Some("Ignore"),
            param_kind,
            constraints: spec.get("matchConstraints").cloned().unwrap_or(Value::Null),
            match_conditions: named("matchConditions"),
            variables: named("variables"),
            validations,
            audit_annotations,
        }
    }

    /// Every expression with its field path, in the order of the spec.
    pub fn expressions(&self) -> Vec<(String, &Expr)> {
        let mut out = Vec::new();
        for (i, v) in self.validations.iter().enumerate() {
            out.push((format!("spec.validations[{i}].expression"), &v.expr));
            if let Some(m) = &v.message_expression {
                out.push((format!("spec.validations[{i}].messageExpression"), m));
            }
        }
        for (i, (_, e)) in self.match_conditions.iter().enumerate() {
            out.push((format!("spec.matchConditions[{i}].expression"), e));
        }
        for (i, (_, e)) in self.variables.iter().enumerate() {
            out.push((format!("spec.variables[{i}].expression"), e));
        }
        for (i, a) in self.audit_annotations.iter().enumerate() {
            out.push((
                format!("spec.auditAnnotations[{i}].valueExpression"),
                &a.value,
            ));
        }
        out
    }

    /// The kinds `spec.matchConstraints.resourceRules` name exactly (no `*`, no subresource),
    /// as (group, version, resource), in rule order without repeats: upstream type-checks
    /// against exact matches only.
    pub fn matched_resources(&self) -> Vec<(String, String, String)> {
        let strings = |v: &Value, key: &str| -> Vec<String> {
            v.get(key)
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .filter(|s| !s.contains('*') && !s.contains('/'))
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut out = Vec::new();
        let rules = self
            .constraints
            .get("resourceRules")
            .and_then(Value::as_array);
        for rule in rules.into_iter().flatten() {
            for g in strings(rule, "apiGroups") {
                for v in strings(rule, "apiVersions") {
                    for r in strings(rule, "resources") {
                        let gvr = (g.clone(), v.clone(), r);
                        if !out.contains(&gvr) {
                            out.push(gvr);
                        }
                    }
                }
            }
        }
        out
    }

    /// `status.typeChecking.expressionWarnings`: the expressions that do not compile, and
    /// the type errors of those that do, checked against each of `kinds` (the matched kinds'
    /// labels and schemas) with `params` as the `paramKind`'s schema. Like upstream, each
    /// kind's errors are prefixed by the kind; without a known kind, `object` is checked as a
    /// value of unknown type (only operand types of literals can be wrong then).
    pub fn expression_warnings(&self, kinds: &[(&str, Node<'_>)], params: Node<'_>) -> Vec<Value> {
        let unknown = serde_json::json!({});
        let any = [("", Node::new(&unknown))];
        let targets: &[(&str, Node<'_>)] = if kinds.is_empty() { &any } else { kinds };
        self.expressions()
            .into_iter()
            .filter_map(|(field, e)| {
                let warning = match &e.program {
                    Err(err) => err.clone(),
                    Ok(_) => {
                        let mut parts = Vec::new();
                        for (gvk, node) in targets {
                            let vars =
                                [("object", *node), ("oldObject", *node), ("params", params)];
                            let errors =
                                crate::cel::typecheck::check(&e.text, &vars).unwrap_or_default();
                            if errors.is_empty() {
                                continue;
                            }
                            let errors = errors.join("\n");
                            parts.push(if gvk.is_empty() {
                                errors
                            } else {
                                format!("{gvk}: {errors}")
                            });
                        }
                        if parts.is_empty() {
                            return None;
                        }
                        parts.join("\n")
                    }
                };
                Some(serde_json::json!({"fieldRef": field, "warning": warning}))
            })
            .collect()
    }
}

/// Compiled policies by `uid`, with the generation they were compiled from.
type Compiled = HashMap<String, (i64, Arc<Policy>)>;
static COMPILED: LazyLock<parking_lot::Mutex<Compiled>> = LazyLock::new(Default::default);
/// The most policies kept compiled; beyond it the cache starts over.
const MAX_COMPILED: usize = 1024;

/// `obj` compiled, from the cache when its `uid` and `generation` were compiled before.
pub(super) fn compiled(obj: &Value) -> Arc<Policy> {
    let uid = setpoint_api::meta::uid(obj).to_string();
    let generation = obj
        .pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    if let Some((g, p)) = COMPILED.lock().get(&uid) {
        if *g == generation {
            return p.clone();
        }
    }
    let policy = Arc::new(Policy::compile(obj));
    let mut cache = COMPILED.lock();
    if cache.len() >= MAX_COMPILED {
        cache.clear();
    }
    cache.insert(uid, (generation, policy.clone()));
    policy
}
