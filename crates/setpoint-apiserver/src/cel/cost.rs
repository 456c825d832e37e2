//! The cost of an expression, in the units upstream's budgets are written in.
//!
//! The `cel` crate has no cost model, so this is one of our own, shaped like cel-go's:
//! reading a variable or a field costs 1, a function call 1, creating a list 10 and a map
//! 30, functions over strings `ceil(length / 10)` more, functions over a whole list its
//! length more (the sets functions the product of both), an authorization check (`check`)
//! upstream's 350000, and a comprehension (`all`, `exists`, `map`, `filter`, ...) its range
//! plus the cost of its body for every element.
//!
//! The same walk gives both numbers upstream uses:
//! - [`estimate`]: the worst case over a schema, when a CRD is written. A list, map or
//!   string is as long as its `maxItems`, `maxProperties` or `maxLength` says, or else as
//!   the largest request body allows for its smallest element, as upstream assumes.
//! - [`actual`]: over the values an evaluation is about to see, before it runs; every
//!   element of a comprehension's range is walked, and the walk stops once over the limit,
//!   so an expensive expression is refused in at most that many steps.
//!
//! The figures differ from cel-go's in detail (cel-go also prices the traversal of each
//! value and rounds differently), so a rule close to a limit may be accepted here and
//! refused upstream or the reverse; the order of magnitude, which is what the limits are
//! for, is the same.

use std::collections::HashMap;

use cel::common::ast::{EntryExpr, Expr, LiteralValue};
use cel::parser::Expression;
use serde_json::Value;

use super::schema::Node;
use super::{Program, MAX_REQUEST_SIZE_BYTES};

/// What the walk knows about a value.
#[derive(Clone, Copy, Debug)]
enum Shape<'a> {
    /// Described by a schema (estimates).
    Schema(Node<'a>),
    /// The value itself (actual costs).
    Data(&'a Value),
    /// Only a bound on its size (a computed value).
    Sized(u64),
}

impl<'a> Shape<'a> {
    /// The length of a string, list or map.
    fn size(&self) -> u64 {
        match self {
            Shape::Data(Value::String(s)) => s.chars().count() as u64,
            Shape::Data(Value::Array(a)) => a.len() as u64,
            Shape::Data(Value::Object(o)) => o.len() as u64,
            Shape::Data(_) => 1,
            Shape::Sized(n) => *n,
            Shape::Schema(node) => schema_size(node),
        }
    }

    fn field(&self, name: &str) -> Shape<'a> {
        match self {
            Shape::Schema(node) => node
                .field(name)
                .map_or(Shape::Sized(MAX_REQUEST_SIZE_BYTES), Shape::Schema),
            // A missing field fails the evaluation: nothing more to cost.
            Shape::Data(v) => v.get(name).map_or(Shape::Sized(0), Shape::Data),
            Shape::Sized(n) => Shape::Sized(*n),
        }
    }

    /// Any one element of a list or value of a map (for an index whose key is not known).
    fn element(&self) -> Shape<'a> {
        match self {
            Shape::Schema(node) => node
                .element()
                .map_or(Shape::Sized(MAX_REQUEST_SIZE_BYTES), Shape::Schema),
            Shape::Data(Value::Array(a)) => {
                Shape::Sized(a.iter().map(|v| Shape::Data(v).size()).max().unwrap_or(0))
            }
            Shape::Data(Value::Object(o)) => {
                Shape::Sized(o.values().map(|v| Shape::Data(v).size()).max().unwrap_or(0))
            }
            Shape::Data(_) => Shape::Sized(0),
            Shape::Sized(n) => Shape::Sized(*n),
        }
    }
}

/// The smallest serialized size of a value of `node`'s type, with its separator: how many
/// fit in the largest request bounds an undeclared `maxItems`.
fn min_serialized_size(node: Option<&Node<'_>>) -> u64 {
    match node.and_then(Node::type_name) {
        // `"",`
        Some("string") => 3,
        // `0,` / `true,`
        Some("integer" | "number" | "boolean") => 2,
        // `{},` / `[],`, and anything undeclared
        _ => 3,
    }
}

fn schema_size(node: &Node<'_>) -> u64 {
    match node.type_name() {
        Some("string") => node.bound("maxLength").unwrap_or(MAX_REQUEST_SIZE_BYTES),
        Some("array") => node.bound("maxItems").unwrap_or_else(|| {
            MAX_REQUEST_SIZE_BYTES / min_serialized_size(node.element().as_ref())
        }),
        Some("object") if node.is_map() || node.open() => {
            node.bound("maxProperties").unwrap_or_else(|| {
                // `"":` before each value.
                MAX_REQUEST_SIZE_BYTES / (3 + min_serialized_size(node.element().as_ref()))
            })
        }
        Some("object") => node
            .schema
            .get("properties")
            .and_then(Value::as_object)
            .map_or(0, |p| p.len() as u64),
        _ => 1,
    }
}

/// The cost of a string function over `size` characters (cel-go's `ceil(size * 0.1)`).
fn string_traversal(size: u64) -> u64 {
    size.div_ceil(10)
}

struct Walk<'a, 'e> {
    scopes: Vec<(&'e str, Shape<'a>)>,
    /// Past it the walk stops (actual costs).
    limit: u64,
    spent: u64,
}

impl<'a, 'e> Walk<'a, 'e> {
    fn lookup(&self, name: &str) -> Shape<'a> {
        self.scopes
            .iter()
            .rev()
            .find(|(n, _)| *n == name)
            .map_or(Shape::Sized(MAX_REQUEST_SIZE_BYTES), |(_, s)| *s)
    }

    fn charge(&mut self, n: u64) {
        self.spent = self.spent.saturating_add(n);
    }

    fn over(&self) -> bool {
        self.spent > self.limit
    }

    /// Walks `e`, adding its cost to `spent`; returns what is known of its value.
    fn walk(&mut self, e: &'e Expression) -> Shape<'a> {
        if self.over() {
            return Shape::Sized(0);
        }
        match &e.expr {
            Expr::Literal(LiteralValue::String(s)) => {
                Shape::Sized(s.inner().chars().count() as u64)
            }
            Expr::Literal(_) | Expr::Unspecified => Shape::Sized(1),
            Expr::Ident(name) => {
                self.charge(1);
                self.lookup(name)
            }
            Expr::Select(select) => {
                let operand = self.walk(&select.operand);
                self.charge(1);
                operand.field(&select.field)
            }
            Expr::List(list) => {
                self.charge(10);
                let mut total = 0u64;
                for el in &list.elements {
                    total = total.saturating_add(self.walk(el).size());
                }
                Shape::Sized(list.elements.len() as u64 + total)
            }
            Expr::Map(map) => {
                self.charge(30);
                for entry in &map.entries {
                    if let EntryExpr::MapEntry(m) = &entry.expr {
                        self.walk(&m.key);
                        self.walk(&m.value);
                    }
                }
                Shape::Sized(map.entries.len() as u64)
            }
            Expr::Struct(s) => {
                self.charge(40);
                for entry in &s.entries {
                    if let EntryExpr::StructField(f) = &entry.expr {
                        self.walk(&f.value);
                    }
                }
                Shape::Sized(s.entries.len() as u64)
            }
            Expr::Call(call) => self.call(&call.func_name, call.target.as_deref(), &call.args),
            Expr::Comprehension(c) => {
                let range = self.walk(&c.iter_range);
                let size = range.size();
                self.walk(&c.accu_init);
                self.scopes.push((&c.accu_var, Shape::Sized(size)));
                match range {
                    Shape::Data(Value::Array(items)) => {
                        // Elements that are not containers cost the same as any other of
                        // their kind and length: their body is walked once.
                        let mut known: HashMap<Option<usize>, u64> = HashMap::new();
                        for item in items {
                            let key = match item {
                                Value::Array(_) | Value::Object(_) => None,
                                Value::String(s) => Some(s.len() + 1),
                                _ => Some(0),
                            };
                            match key.and_then(|k| known.get(&Some(k)).copied()) {
                                Some(cost) => self.charge(cost),
                                None => {
                                    let before = self.spent;
                                    self.iteration(c, Shape::Data(item), None);
                                    if key.is_some() {
                                        known.insert(key, self.spent - before);
                                    }
                                }
                            }
                            if self.over() {
                                break;
                            }
                        }
                    }
                    Shape::Data(Value::Object(entries)) => {
                        for (key, value) in entries {
                            let key = Shape::Sized(key.chars().count() as u64);
                            self.iteration(c, key, Some(Shape::Data(value)));
                            if self.over() {
                                break;
                            }
                        }
                    }
                    other => {
                        // One element stands for all of them: the body's cost times the size.
                        let element = other.element();
                        let (first, second) = if matches!(other, Shape::Schema(n) if n.is_map()) {
                            (
                                Shape::Sized(MAX_REQUEST_SIZE_BYTES.min(size)),
                                Some(element),
                            )
                        } else {
                            (element, Some(element))
                        };
                        let before = self.spent;
                        self.iteration(c, first, second);
                        let each = self.spent - before;
                        self.spent = before.saturating_add(each.saturating_mul(size));
                    }
                }
                self.walk(&c.result);
                self.scopes.pop();
                Shape::Sized(size)
            }
        }
    }

    fn iteration(
        &mut self,
        c: &'e cel::common::ast::ComprehensionExpr,
        first: Shape<'a>,
        second: Option<Shape<'a>>,
    ) {
        let pushed = match (&c.iter_var2, second) {
            (Some(v2), Some(s)) => {
                self.scopes.push((&c.iter_var, first));
                self.scopes.push((v2, s));
                2
            }
            _ => {
                self.scopes.push((&c.iter_var, first));
                1
            }
        };
        self.charge(1);
        self.walk(&c.loop_cond);
        self.walk(&c.loop_step);
        for _ in 0..pushed {
            self.scopes.pop();
        }
    }

    fn call(
        &mut self,
        name: &str,
        target: Option<&'e Expression>,
        args: &'e [Expression],
    ) -> Shape<'a> {
        let target = target.map(|t| self.walk(t));
        let shapes: Vec<Shape<'a>> = args.iter().map(|a| self.walk(a)).collect();
        let receiver = target.or_else(|| shapes.first().copied());
        let receiver_size = receiver.map_or(0, |r| r.size());
        let largest = target
            .iter()
            .chain(shapes.iter())
            .map(Shape::size)
            .max()
            .unwrap_or(0);
        self.charge(1);
        match name {
            "_[_]" | "_[?_]" => {
                let container = receiver.unwrap_or(Shape::Sized(0));
                return match (&container, args.get(1).map(|a| &a.expr)) {
                    (
                        Shape::Data(Value::Array(items)),
                        Some(Expr::Literal(LiteralValue::Int(i))),
                    ) => usize::try_from(*i.inner())
                        .ok()
                        .and_then(|i| items.get(i))
                        .map_or(Shape::Sized(0), Shape::Data),
                    (_, Some(Expr::Literal(LiteralValue::String(key)))) => {
                        container.field(key.inner())
                    }
                    _ => container.element(),
                };
            }
            // Equality, ordering and concatenation walk both sides.
            "_==_" | "_!=_" | "_<_" | "_<=_" | "_>_" | "_>=_" => {
                self.charge(string_traversal(largest));
                return Shape::Sized(1);
            }
            "_+_" => {
                let total: u64 = shapes.iter().map(Shape::size).sum();
                self.charge(string_traversal(total));
                return Shape::Sized(total);
            }
            "@in" => {
                let container = shapes.get(1).map_or(0, Shape::size);
                self.charge(container);
                return Shape::Sized(1);
            }
            // Whole-list functions.
            "isSorted" | "sum" | "min" | "max" | "distinct" | "flatten" | "reverse" | "slice"
            | "join" => {
                self.charge(receiver_size);
            }
            "sort" => {
                // n log n
                let n = receiver_size;
                self.charge(n.saturating_mul(u64::from(64 - n.leading_zeros())));
            }
            "indexOf" | "lastIndexOf" => {
                self.charge(receiver_size.max(string_traversal(receiver_size)));
            }
            // An authorization check asks the authorizers: upstream prices it far above
            // anything else, so that only two fit in one expression.
            "check" => {
                self.charge(super::authz::CHECK_COST);
                return Shape::Sized(1);
            }
            "sets.contains" | "sets.equivalent" | "sets.intersects" => {
                let a = shapes.first().map_or(0, Shape::size);
                let b = shapes.get(1).map_or(0, Shape::size);
                self.charge(a.saturating_mul(b));
            }
            // Functions over a string's characters.
            "matches" | "find" | "findAll" | "contains" | "startsWith" | "endsWith" | "split"
            | "replace" | "lowerAscii" | "upperAscii" | "trim" | "substring" | "charAt"
            | "format" | "quote" | "url" | "isURL" | "quantity" | "isQuantity" | "ip" | "isIP"
            | "cidr" | "isCIDR" | "validate" | "base64.encode" | "base64.decode" | "string"
            | "bytes" => {
                self.charge(string_traversal(largest));
            }
            _ => {}
        }
        Shape::Sized(largest)
    }
}

fn run<'a, 'e>(program: &'e Program, vars: Vec<(&'e str, Shape<'a>)>, limit: u64) -> u64 {
    let mut walk = Walk {
        scopes: vars,
        limit,
        spent: 0,
    };
    walk.walk(program.expression());
    walk.spent
}

/// The cost of evaluating `program` over `vars` and the library values named `opaque`
/// (the `authorizer`, of no size), or a number above `limit` once it is known to exceed it.
pub fn actual(program: &Program, vars: &[(&str, &Value)], opaque: &[&str], limit: u64) -> u64 {
    let vars = opaque
        .iter()
        .map(|n| (*n, Shape::Sized(1)))
        .chain(vars.iter().map(|(n, v)| (*n, Shape::Data(v))))
        .collect();
    run(program, vars, limit)
}

/// The worst-case cost of `program` with each variable described by a schema; variables
/// not named are assumed as large as a request can be.
pub fn estimate(program: &Program, vars: &[(&str, Node<'_>)]) -> u64 {
    let vars = vars
        .iter()
        .map(|(n, s)| (*n, Shape::Schema(s.resolved())))
        .collect();
    run(program, vars, u64::MAX)
}

/// The maximum number of times a rule at `node` runs for one value of its parent: the
/// length bound of a list's items or a map's values, 1 for anything else. Multiplying the
/// factors along a schema's path gives a rule's cardinality, what upstream multiplies its
/// cost by for the CRD-wide total.
pub fn cardinality_factor(parent: &Node<'_>) -> u64 {
    match parent.type_name() {
        Some("array") | Some("object") if parent.element().is_some() => schema_size(parent),
        _ => 1,
    }
}

/// Upstream's message when an estimated cost is over `limit`, e.g. `estimated rule cost
/// exceeds budget by factor of 2.5x (try simplifying the rule, ...)`.
pub fn exceeds_budget_message(cost_name: &str, cost: u64, limit: u64) -> String {
    let factor = cost as f64 / limit as f64;
    let factor = if factor > 100.0 {
        "more than 100x".to_string()
    } else if factor < 1.5 {
        format!("{factor:.6}x")
    } else {
        format!("{factor:.1}x")
    };
    format!(
        "{cost_name} exceeds budget by factor of {factor} (try simplifying the rule, or adding \
         maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cel::compile;
    use serde_json::json;

    fn est(expr: &str, schema: &Value) -> u64 {
        estimate(&compile(expr).unwrap(), &[("self", Node::new(schema))])
    }

    #[test]
    fn bounds_make_estimates_small() {
        let bounded =
            json!({"type": "array", "maxItems": 10, "items": {"type": "string", "maxLength": 20}});
        let unbounded = json!({"type": "array", "items": {"type": "string"}});
        let rule = "self.all(x, x.startsWith('a'))";
        let small = est(rule, &bounded);
        assert!(small < 100, "{small}");
        let large = est(rule, &unbounded);
        assert!(large > super::super::STATIC_ESTIMATED_COST_LIMIT, "{large}");
        // Nested comprehensions over an unbounded list are far beyond any budget.
        let nested = est("self.all(a, self.all(b, a == b))", &unbounded);
        assert!(
            nested > 100 * super::super::STATIC_ESTIMATED_COST_LIMIT,
            "{nested}"
        );
    }

    #[test]
    fn simple_rules_are_cheap() {
        let schema = json!({"type": "object", "properties": {
            "min": {"type": "integer"}, "max": {"type": "integer"}}});
        assert!(est("self.min <= self.max", &schema) < 10);
    }

    #[test]
    fn actual_costs_follow_the_data_and_stop_at_the_limit() {
        let p = compile("self.items.all(i, i > 0)").unwrap();
        let short = json!({"items": [1, 2]});
        let long = json!({"items": (0..1000).collect::<Vec<_>>()});
        let a = actual(&p, &[("self", &short)], &[], u64::MAX);
        let b = actual(&p, &[("self", &long)], &[], u64::MAX);
        assert!(a < b && b > 1000, "{a} {b}");
        let capped = actual(&p, &[("self", &long)], &[], 100);
        assert!((101..200).contains(&capped), "{capped}");
    }

    #[test]
    fn messages_are_upstreams() {
        assert_eq!(
            exceeds_budget_message("estimated rule cost", 25, 10),
            "estimated rule cost exceeds budget by factor of 2.5x (try simplifying the rule, \
             or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings \
             are declared)"
        );
        assert!(exceeds_budget_message("estimated rule cost", 1001, 10)
            .contains("factor of more than 100x"));
        assert!(
            exceeds_budget_message("estimated rule cost", 11, 10).contains("factor of 1.100000x")
        );
    }
}
