//! Type checking of an expression against the schemas of its variables: references to
//! fields a schema does not declare, and operators applied to types that have no overload
//! for them, reported as cel-go's checker words them:
//!
//! ```text
//! ERROR: <input>:1:12: undefined field 'replica'
//!  | object.spec.replica > 1
//!  | ...........^
//! ```
//!
//! This is what a ValidatingAdmissionPolicy's `status.typeChecking.expressionWarnings`
//! holds (prefixed by the kind checked against). It is a checker of references and of the
//! operand types of operators, not CEL's full type inference: function calls on values of
//! known types are not checked, and a value whose type is not known (a map's values of
//! an unknown schema, `x-kubernetes-int-or-string`, computed values) matches anything.

use cel::common::ast::{EntryExpr, Expr, LiteralValue};
use cel::parser::Expression;

use super::schema::Node;
use super::{compile, Error, Program};

/// The type of an expression, as far as the checker knows it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Ty<'a> {
    Int,
    Uint,
    Double,
    String,
    Bool,
    Null,
    List,
    Map,
    /// A value described by a schema node (an object with declared properties, typically).
    Schema(Node<'a>),
    Dyn,
}

impl PartialEq for Node<'_> {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self.schema, other.schema)
    }
}

impl<'a> Ty<'a> {
    /// The CEL name of the type, for messages; `None` when not known.
    fn name(&self) -> Option<&'static str> {
        Some(match self.concrete() {
            Ty::Int => "int",
            Ty::Uint => "uint",
            Ty::Double => "double",
            Ty::String => "string",
            Ty::Bool => "bool",
            Ty::Null => "null_type",
            Ty::List => "list",
            Ty::Map => "map",
            Ty::Schema(_) | Ty::Dyn => return None,
        })
    }

    /// A schema node's type as a CEL type.
    fn concrete(&self) -> Ty<'a> {
        match self {
            Ty::Schema(node) => {
                if node.schema.get("x-kubernetes-int-or-string")
                    == Some(&serde_json::Value::Bool(true))
                {
                    return Ty::Dyn;
                }
                match node.type_name() {
                    Some("integer") => Ty::Int,
                    Some("number") => Ty::Double,
                    Some("string") => Ty::String,
                    Some("boolean") => Ty::Bool,
                    Some("array") => Ty::List,
                    Some("object") if node.is_map() => Ty::Map,
                    _ => Ty::Dyn,
                }
            }
            other => *other,
        }
    }

    fn numeric(&self) -> bool {
        matches!(self.concrete(), Ty::Int | Ty::Uint | Ty::Double)
    }
}

struct Checker<'p, 'a> {
    program: &'p Program,
    scopes: Vec<(String, Ty<'a>)>,
    errors: Vec<String>,
}

impl<'a> Checker<'_, 'a> {
    fn report(&mut self, id: u64, message: String) {
        self.errors.push(self.program.error_at(id, &message));
    }

    fn lookup(&self, name: &str) -> Ty<'a> {
        self.scopes
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map_or(Ty::Dyn, |(_, t)| *t)
    }

    fn check(&mut self, e: &Expression) -> Ty<'a> {
        match &e.expr {
            Expr::Literal(l) => match l {
                LiteralValue::Boolean(_) => Ty::Bool,
                LiteralValue::Int(_) => Ty::Int,
                LiteralValue::UInt(_) => Ty::Uint,
                LiteralValue::Double(_) => Ty::Double,
                LiteralValue::String(_) => Ty::String,
                LiteralValue::Null => Ty::Null,
                LiteralValue::Bytes(_) => Ty::Dyn,
            },
            Expr::Ident(name) => self.lookup(name),
            Expr::Select(select) => {
                let operand = self.check(&select.operand);
                self.select(e.id, operand, &select.field)
            }
            Expr::List(list) => {
                for el in &list.elements {
                    self.check(el);
                }
                Ty::List
            }
            Expr::Map(map) => {
                for entry in &map.entries {
                    if let EntryExpr::MapEntry(m) = &entry.expr {
                        self.check(&m.key);
                        self.check(&m.value);
                    }
                }
                Ty::Map
            }
            Expr::Struct(s) => {
                for entry in &s.entries {
                    if let EntryExpr::StructField(f) = &entry.expr {
                        self.check(&f.value);
                    }
                }
                Ty::Dyn
            }
            Expr::Comprehension(c) => {
                let range = self.check(&c.iter_range);
                let (first, second) = match range {
                    Ty::Schema(node) if node.is_map() => {
                        (Ty::String, node.element().map_or(Ty::Dyn, Ty::Schema))
                    }
                    Ty::Schema(node) => {
                        let el = node.element().map_or(Ty::Dyn, Ty::Schema);
                        (el, el)
                    }
                    _ => (Ty::Dyn, Ty::Dyn),
                };
                // The range of a two-variable comprehension over a list binds the index first.
                let (first, second) = match (&c.iter_var2, range.concrete()) {
                    (Some(_), Ty::List) => (Ty::Int, first),
                    _ => (first, second),
                };
                self.check(&c.accu_init);
                self.scopes.push((c.accu_var.clone(), Ty::Dyn));
                self.scopes.push((c.iter_var.clone(), first));
                if let Some(v2) = &c.iter_var2 {
                    self.scopes.push((v2.clone(), second));
                }
                self.check(&c.loop_cond);
                self.check(&c.loop_step);
                if c.iter_var2.is_some() {
                    self.scopes.pop();
                }
                self.scopes.pop();
                let result = self.check(&c.result);
                self.scopes.pop();
                result
            }
            Expr::Call(call) => {
                let target = call.target.as_deref().map(|t| self.check(t));
                let args: Vec<Ty<'a>> = call.args.iter().map(|a| self.check(a)).collect();
                self.call(e.id, &call.func_name, target, &args)
            }
            Expr::Unspecified => Ty::Dyn,
        }
    }

    fn select(&mut self, id: u64, operand: Ty<'a>, field: &str) -> Ty<'a> {
        let Ty::Schema(node) = operand else {
            return Ty::Dyn;
        };
        match node.type_name() {
            Some("object") | None => {}
            Some(_) => {
                let t = operand.name().unwrap_or("dyn");
                self.report(id, format!("type '{t}' does not support field selection"));
                return Ty::Dyn;
            }
        }
        match node.field(field) {
            Some(f) => Ty::Schema(f),
            None if node.open() => Ty::Dyn,
            None => {
                self.report(id, format!("undefined field '{field}'"));
                Ty::Dyn
            }
        }
    }

    fn call(&mut self, id: u64, name: &str, target: Option<Ty<'a>>, args: &[Ty<'a>]) -> Ty<'a> {
        match (name, args) {
            ("_==_" | "_!=_", [a, b]) => {
                if let (Some(x), Some(y)) = (a.name(), b.name()) {
                    let comparable = x == y
                        || (a.numeric() && b.numeric())
                        || x == "null_type"
                        || y == "null_type";
                    if !comparable {
                        self.no_overload(id, name, &[x, y]);
                    }
                }
                Ty::Bool
            }
            ("_<_" | "_<=_" | "_>_" | "_>=_", [a, b]) => {
                if let (Some(x), Some(y)) = (a.name(), b.name()) {
                    let orderable = (x == y
                        && matches!(x, "int" | "uint" | "double" | "string" | "bool"))
                        || (a.numeric() && b.numeric());
                    if !orderable {
                        self.no_overload(id, name, &[x, y]);
                    }
                }
                Ty::Bool
            }
            ("_-_" | "_*_" | "_/_" | "_%_", [a, b]) => match (a.name(), b.name()) {
                (Some(x), Some(y)) if x != y || !a.numeric() => {
                    self.no_overload(id, name, &[x, y]);
                    Ty::Dyn
                }
                (Some(_), Some(_)) => a.concrete(),
                _ => Ty::Dyn,
            },
            ("_+_", [a, b]) => match (a.name(), b.name()) {
                (Some(x), Some(y)) if x != y || matches!(x, "bool" | "null_type" | "map") => {
                    self.no_overload(id, name, &[x, y]);
                    Ty::Dyn
                }
                (Some(_), Some(_)) => a.concrete(),
                _ => Ty::Dyn,
            },
            ("_&&_" | "_||_" | "!_" | "@in" | "@not_strictly_false", _) => Ty::Bool,
            ("_?_:_", [_, a, b]) => {
                if a == b {
                    *a
                } else {
                    Ty::Dyn
                }
            }
            // `self['field']` on an object reads a declared property: not known which.
            ("_[_]", [Ty::Schema(node), _])
                if node.type_name() == Some("object") && !node.is_map() =>
            {
                Ty::Dyn
            }
            ("_[_]", [Ty::Schema(node), _]) => node.element().map_or(Ty::Dyn, Ty::Schema),
            ("size", _) => Ty::Int,
            // The authorizer library's decisions (its only functions of these names).
            ("allowed" | "errored", []) if target.is_some() => Ty::Bool,
            ("reason" | "error", []) if target.is_some() => Ty::String,
            ("startsWith" | "endsWith" | "contains" | "matches", _) => {
                if let Some(t) = target {
                    if let Some(n) = t.name() {
                        if n != "string" {
                            let arg_names: Vec<&str> =
                                args.iter().map(|a| a.name().unwrap_or("dyn")).collect();
                            self.report(
                                id,
                                format!(
                                    "found no matching overload for '{name}' applied to '{n}.({})'",
                                    arg_names.join(", ")
                                ),
                            );
                        }
                    }
                }
                Ty::Bool
            }
            _ => Ty::Dyn,
        }
    }

    fn no_overload(&mut self, id: u64, name: &str, types: &[&str]) {
        self.report(
            id,
            format!(
                "found no matching overload for '{name}' applied to '({})'",
                types.join(", ")
            ),
        );
    }
}

/// Checks `expression` against the schemas of its variables (`object`, `oldObject`,
/// `params`, or `self`); returns cel-go-style errors, one per problem, empty when none was
/// found. Variables not listed are of unknown type and are not checked. A compilation error
/// is returned as the error.
pub fn check(expression: &str, vars: &[(&str, Node<'_>)]) -> Result<Vec<String>, Error> {
    let program = compile(expression)?;
    let mut checker = Checker {
        program: &program,
        scopes: vars
            .iter()
            .map(|(n, s)| (n.to_string(), Ty::Schema(s.resolved())))
            .collect(),
        errors: Vec::new(),
    };
    checker.check(program.expression());
    Ok(checker.errors)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn deployment() -> Value {
        json!({"type": "object", "properties": {
            "metadata": {"type": "object", "properties": {
                "name": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}}}},
            "spec": {"$ref": "#/components/schemas/DeploymentSpec"}}})
    }

    fn definitions() -> Value {
        json!({"DeploymentSpec": {"type": "object", "properties": {
            "replicas": {"type": "integer"},
            "template": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            "paused": {"type": "boolean"},
            "ports": {"type": "array", "items": {"type": "object", "properties": {
                "port": {"type": "integer"}}}}}}})
    }

    fn warnings(expr: &str) -> Vec<String> {
        let (d, defs) = (deployment(), definitions());
        check(expr, &[("object", Node::with_definitions(&d, &defs))]).unwrap()
    }

    #[test]
    fn known_fields_pass() {
        for e in [
            "object.spec.replicas > 1",
            "object.metadata.labels['app'] == 'web'",
            "object.metadata.labels.app == 'web'",
            "object.spec.template.anything.goes",
            "object.spec.ports.all(p, p.port > 0 && p.port < 65536)",
            "has(object.spec.paused) && object.spec.paused",
            "request.anything > 1",
            "object.spec.replicas < 2.5",
            "authorizer.group('apps').resource('deployments').check('update').allowed()",
            "authorizer.requestResource.check('approve').reason() == ''",
        ] {
            assert_eq!(warnings(e), Vec::<String>::new(), "{e}");
        }
    }

    #[test]
    fn undefined_fields_are_reported_where_they_are() {
        let w = warnings("object.spec.replica > 1");
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(
            w[0],
            "ERROR: <input>:1:12: undefined field 'replica'\n | object.spec.replica > 1\n | ...........^"
        );
        let w = warnings("object.spec.ports.exists(p, p.prt == 80)");
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("undefined field 'prt'"));
    }

    #[test]
    fn operand_type_mismatches_are_reported() {
        let w = warnings("object.spec.replicas == 'three'");
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("found no matching overload for '_==_' applied to '(int, string)'"),
            "{}",
            w[0]
        );
        let w = warnings("object.metadata.name > 1");
        assert!(w[0].contains("'_>_' applied to '(string, int)'"), "{w:?}");
        let w = warnings("authorizer.path('/healthz').check('get').allowed() == 'yes'");
        assert!(w[0].contains("'_==_' applied to '(bool, string)'"), "{w:?}");
        let w = warnings("object.spec.replicas.startsWith('a')");
        assert!(
            w[0].contains("'startsWith' applied to 'int.(string)'"),
            "{w:?}"
        );
    }
}
