//! Compiling an expression against the variables its context declares: cel-go's checker
//! refuses a name that is neither a declared variable nor bound by a comprehension
//! (`undeclared reference to 'x' (in container '')`), which the parser alone accepts.

use std::sync::Arc;

use cel::common::ast::{EntryExpr, Expr};
use cel::parser::Expression;

use super::{compile, Error, Program};

/// Names a call can be qualified by that are function namespaces of the environment, not
/// variables (`math.greatest(...)`, `strings.quote(...)`, `sets.contains(...)`, ...).
const FUNCTION_NAMESPACES: &[&str] = &["math", "strings", "base64", "sets", "lists", "optional"];

/// CEL's type identifiers, which an expression may name as values (`type(x) == int`).
const TYPE_NAMES: &[&str] = &[
    "int",
    "uint",
    "double",
    "string",
    "bool",
    "bytes",
    "list",
    "map",
    "null_type",
    "type",
    "dyn",
];

/// Compiles `expression` where only the variables `declared` exist; a syntax error, or a
/// reference to any other name, is a compilation error worded as cel-go words it.
pub fn compile_declared(expression: &str, declared: &[&str]) -> Result<Arc<Program>, Error> {
    let program = compile(expression)?;
    let mut walk = Walk {
        program: &program,
        scopes: declared.iter().map(|d| d.to_string()).collect(),
        errors: Vec::new(),
    };
    walk.expr(program.expression());
    if walk.errors.is_empty() {
        Ok(program)
    } else {
        Err(Error::Compile(walk.errors.join("\n")))
    }
}

struct Walk<'p> {
    program: &'p Program,
    scopes: Vec<String>,
    errors: Vec<String>,
}

impl Walk<'_> {
    fn ident(&mut self, id: u64, name: &str) {
        if !self.scopes.iter().any(|s| s == name) && !TYPE_NAMES.contains(&name) {
            let message = format!("undeclared reference to '{name}' (in container '')");
            self.errors.push(self.program.error_at(id, &message));
        }
    }

    fn expr(&mut self, e: &Expression) {
        match &e.expr {
            Expr::Ident(name) => self.ident(e.id, name),
            Expr::Select(select) => self.expr(&select.operand),
            Expr::List(list) => list.elements.iter().for_each(|el| self.expr(el)),
            Expr::Map(map) => {
                for entry in &map.entries {
                    if let EntryExpr::MapEntry(m) = &entry.expr {
                        self.expr(&m.key);
                        self.expr(&m.value);
                    }
                }
            }
            Expr::Struct(s) => {
                for entry in &s.entries {
                    if let EntryExpr::StructField(f) = &entry.expr {
                        self.expr(&f.value);
                    }
                }
            }
            Expr::Comprehension(c) => {
                self.expr(&c.iter_range);
                self.expr(&c.accu_init);
                let bound = 2 + usize::from(c.iter_var2.is_some());
                self.scopes.push(c.accu_var.clone());
                self.scopes.push(c.iter_var.clone());
                self.scopes.extend(c.iter_var2.clone());
                self.expr(&c.loop_cond);
                self.expr(&c.loop_step);
                self.expr(&c.result);
                self.scopes.truncate(self.scopes.len() - bound);
            }
            Expr::Call(call) => {
                match call.target.as_deref() {
                    Some(t) if matches!(&t.expr, Expr::Ident(n) if FUNCTION_NAMESPACES.contains(&n.as_str())) =>
                        {}
                    Some(t) => self.expr(t),
                    None => {}
                }
                call.args.iter().for_each(|a| self.expr(a));
            }
            Expr::Literal(_) | Expr::Unspecified => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WEBHOOK: &[&str] = &["object", "oldObject", "request", "authorizer"];

    fn error(expr: &str) -> String {
        compile_declared(expr, WEBHOOK).unwrap_err().to_string()
    }

    #[test]
    fn declared_names_and_comprehension_variables_compile() {
        for e in [
            "object.metadata.name == 'x'",
            "request.userInfo.username != '' && oldObject == null",
            "object.spec.containers.all(c, c.image.startsWith('r/'))",
            "object.spec.containers.exists(c, c.ports.all(p, p.containerPort > c.ports.size()))",
            "authorizer.group('apps').resource('deployments').check('get').allowed()",
            "type(object) == map && math.greatest(1, 2) == 2",
            "object.metadata.labels.map(k, k + 'x').size() >= 0",
        ] {
            assert!(compile_declared(e, WEBHOOK).is_ok(), "{e}");
        }
    }

    #[test]
    fn undeclared_names_are_compile_errors() {
        assert_eq!(
            error("params.data.max > 1"),
            "compilation failed: ERROR: <input>:1:1: undeclared reference to 'params' (in container '')\n \
             | params.data.max > 1\n | ^"
        );
        // A comprehension's variable does not outlive it.
        assert!(error("object.spec.containers.all(c, true) && c.name == ''")
            .contains("undeclared reference to 'c'"));
        assert!(compile_declared("params.x", &["params"]).is_ok());
    }

    #[test]
    fn syntax_errors_are_compile_errors() {
        let e = compile_declared("object.spec.replicas >", WEBHOOK).unwrap_err();
        assert!(matches!(e, Error::Compile(_)), "{e:?}");
        assert!(e.to_string().starts_with("compilation failed: "), "{e}");
    }
}
