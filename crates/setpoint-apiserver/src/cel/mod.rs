//! The one CEL environment of the API server: custom resources' `x-kubernetes-validations`,
//! admission webhooks' `matchConditions` and admission policies all compile and evaluate
//! their expressions here.
//!
//! The environment is CEL's standard library (the `cel` crate), the crate's `strings`,
//! `lists`, `math` and `base64` extensions, and Kubernetes' own libraries in [`libs`]:
//! lists (`isSorted`, `sum`, `min`, `max`, `indexOf`, `lastIndexOf`), sets, regex (`find`,
//! `findAll`), URLs, IP addresses and CIDRs, quantities, named formats and the authorizer
//! checks of admission policies and webhooks' `matchConditions` ([`authz`], whose variables
//! only [`evaluate_with`] and [`evaluate_bool`] bind, when given them).
//! Programs are compiled once and cached by their source text.
//!
//! Every evaluation is costed first ([`cost`]): the cost of an expression over the actual
//! values bound is bounded before it runs, and an expression over the per-call limit is
//! refused without running, as upstream cancels it; a request's evaluations share a
//! [`Budget`]. [`typecheck`] reports field references a schema does not have.

pub mod cost;
mod declared;
mod libs;
pub mod schema;
pub mod typecheck;

pub use declared::compile_declared;
pub use libs::authz;

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use serde_json::Value;

/// Upstream's per-expression runtime cost limit (`PerCallLimit`).
pub const PER_CALL_LIMIT: u64 = 1_000_000;
/// Upstream's runtime cost budget of one request's custom resource validation
/// (`RuntimeCELCostBudget`).
pub const RUNTIME_COST_BUDGET: u64 = 10_000_000;
/// Upstream's limit on one expression's estimated cost when a CRD or policy is written
/// (`StaticEstimatedCostLimit`).
pub const STATIC_ESTIMATED_COST_LIMIT: u64 = 10_000_000;
/// Upstream's limit on the estimated cost of all of a CRD schema's rules, each multiplied by
/// how many times it can run for one object (`StaticEstimatedCRDCostLimit`).
pub const STATIC_ESTIMATED_CRD_COST_LIMIT: u64 = 100_000_000;
/// The largest request body, which bounds every list, map and string a rule can see when no
/// `maxItems`, `maxProperties` or `maxLength` does (upstream's `MaxRequestSizeBytes`).
pub const MAX_REQUEST_SIZE_BYTES: u64 = 3 * 1024 * 1024;

/// The error cel-go reports when an evaluation exceeds its per-call limit; upstream's
/// messages quote it.
pub const ACTUAL_COST_LIMIT_EXCEEDED: &str = "operation cancelled: actual cost limit exceeded";

/// Why an expression could not be compiled or evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The expression does not parse.
    #[error("compilation failed: {0}")]
    Compile(String),
    /// Evaluation failed (no such key, overload, division by zero, ...).
    #[error("{0}")]
    Execution(String),
    /// The expression's cost over the values bound is above the per-call limit.
    #[error("operation cancelled: actual cost limit exceeded")]
    CallCostExceeded,
    /// The request's budget is spent.
    #[error("validation failed due to running out of cost budget, no further validation rules will be run")]
    BudgetExhausted,
}

/// A compiled expression.
#[derive(Debug)]
pub struct Program {
    program: cel::Program,
    source: String,
}

impl Program {
    /// The expression's source text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the expression names variable `name` (e.g. `oldSelf`, for transition rules).
    pub fn uses_variable(&self, name: &str) -> bool {
        self.program.references().variables().contains(&name)
    }

    /// The parsed expression.
    pub fn expression(&self) -> &cel::parser::Expression {
        self.program.expression()
    }

    /// Where expression node `id` starts in the source: 1-based line and 0-based column,
    /// as cel-go's messages count them.
    pub fn location(&self, id: u64) -> Option<(usize, usize)> {
        let (start, _) = self.program.source_info().offset_for(id)?;
        let before = self.source.get(..start as usize)?;
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count());
        Some((line, column))
    }

    /// `message` about expression node `id`, located as cel-go's checker reports it: the
    /// position, then the source line with a caret under the node.
    pub fn error_at(&self, id: u64, message: &str) -> String {
        let (line, column) = self.location(id).unwrap_or((1, 0));
        let text = self.source.lines().nth(line - 1).unwrap_or("");
        format!(
            "ERROR: <input>:{line}:{}: {message}\n | {text}\n | {}^",
            column + 1,
            ".".repeat(column)
        )
    }
}

/// A request's remaining runtime cost: every evaluation made for one request draws from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    remaining: u64,
}

impl Budget {
    /// A budget of `total` cost units.
    pub fn new(total: u64) -> Budget {
        Budget { remaining: total }
    }

    /// A custom resource request's budget, upstream's `RuntimeCELCostBudget`.
    pub fn per_request() -> Budget {
        Budget::new(RUNTIME_COST_BUDGET)
    }

    /// What is left.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// Whether nothing is left.
    pub fn exhausted(&self) -> bool {
        self.remaining == 0
    }
}

/// The environment every expression is compiled and evaluated in.
static ENV: LazyLock<Arc<cel::Env>> = LazyLock::new(|| {
    let mut env = cel::Env::stdlib();
    // Each registration adds functions under names no other library declares; a clash is a
    // programming error found by the first test that builds the environment.
    env.add_extension(cel::extensions::strings)
        .expect("strings extension");
    env.add_extension(cel::extensions::lists)
        .expect("lists extension");
    env.add_extension(cel::extensions::math)
        .expect("math extension");
    env.add_extension(cel::extensions::encoders)
        .expect("encoders extension");
    env.add_extension(libs::register)
        .expect("Kubernetes CEL libraries");
    Arc::new(env)
});

/// Compiled programs by source text (expressions repeat across objects and requests;
/// compiling is the costly part).
static PROGRAMS: LazyLock<Mutex<HashMap<String, Arc<Program>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));
/// The most programs kept; beyond it the cache starts over.
const MAX_CACHED: usize = 4096;

/// Compiles `expression` in the shared environment, or returns the cached program.
pub fn compile(expression: &str) -> Result<Arc<Program>, Error> {
    let mut cache = PROGRAMS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = cache.get(expression) {
        return Ok(p.clone());
    }
    let program = ENV
        .compile(expression)
        .map_err(|e| Error::Compile(e.to_string()))?;
    let program = Arc::new(Program {
        program,
        source: expression.to_string(),
    });
    if cache.len() >= MAX_CACHED {
        cache.clear();
    }
    cache.insert(expression.to_string(), program.clone());
    Ok(program)
}

/// Evaluates `program` with `vars` bound: its cost over those values is measured first and
/// must be within [`PER_CALL_LIMIT`] and what is left of `budget`, which it is drawn from.
pub fn evaluate(
    program: &Program,
    vars: &[(&str, &Value)],
    budget: &mut Budget,
) -> Result<cel::Value, Error> {
    evaluate_with(program, vars, None, budget)
}

/// [`evaluate`], with the `authorizer` variables of `authorizer` bound too when given.
pub fn evaluate_with(
    program: &Program,
    vars: &[(&str, &Value)],
    authorizer: Option<&authz::Bindings>,
    budget: &mut Budget,
) -> Result<cel::Value, Error> {
    let limit = PER_CALL_LIMIT.min(budget.remaining);
    let opaque: &[&str] = match authorizer {
        Some(_) => &[authz::VARIABLE],
        None => &[],
    };
    let cost = cost::actual(program, vars, opaque, limit);
    if cost > budget.remaining {
        budget.remaining = 0;
        return Err(Error::BudgetExhausted);
    }
    if cost > PER_CALL_LIMIT {
        budget.remaining = 0;
        return Err(Error::CallCostExceeded);
    }
    budget.remaining -= cost;
    let mut ctx = cel::Context::with_env(ENV.clone());
    for (name, v) in vars {
        ctx.add_variable_from_value(*name, json_value(v));
    }
    if let Some(a) = authorizer {
        a.bind(&mut ctx);
    }
    program
        .program
        .execute(&ctx)
        .map_err(|e| Error::Execution(execution_error(&e)))
}

/// A JSON value as CEL sees an object of the API: every integer that fits is an `int`, as
/// cel-go's view of unstructured objects makes it (a generic serializer would make
/// non-negative numbers `uint`, and `object.spec.replicas * 2` would find no overload).
pub fn json_value(v: &Value) -> cel::Value {
    match v {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => cel::Value::Int(i),
            (None, Some(u)) => cel::Value::UInt(u),
            _ => cel::Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => cel::Value::String(Arc::new(s.clone())),
        Value::Array(items) => cel::Value::List(Arc::new(items.iter().map(json_value).collect())),
        Value::Object(fields) => {
            let map: HashMap<String, cel::Value> = fields
                .iter()
                .map(|(k, v)| (k.clone(), json_value(v)))
                .collect();
            cel::Value::Map(map.into())
        }
    }
}

/// Evaluates `expression` with `vars` (and, when given and the expression reads it, the
/// `authorizer` of `authorizer`) bound and requires a bool (admission webhooks'
/// `matchConditions`); the error says why it could not (compilation, evaluation, cost, type).
pub fn evaluate_bool(
    expression: &str,
    vars: &[(&str, &Value)],
    authorizer: Option<&authz::Bindings>,
    budget: &mut Budget,
) -> Result<bool, Error> {
    let program = compile(expression)?;
    let authorizer = authorizer.filter(|_| program.uses_variable(authz::VARIABLE));
    match evaluate_with(&program, vars, authorizer, budget)? {
        cel::Value::Bool(b) => Ok(b),
        other => Err(Error::Execution(format!(
            "expected a bool, got a {}",
            other.type_of()
        ))),
    }
}

/// What an evaluation error says, by the types of the values involved and never their
/// contents: the library's own text prints values with `Debug`, which is not meant for users
/// and lists a map's entries in no fixed order, so one rule could fail with differing messages.
pub fn execution_error(e: &cel::ExecutionError) -> String {
    use cel::ExecutionError as E;
    match e {
        E::UnsupportedTargetType { target } => {
            format!("invalid argument type: {}", target.type_of())
        }
        E::NotSupportedAsMethod { method, target } => {
            format!("no such overload: {}.{method}()", target.type_of())
        }
        E::UnsupportedKeyType(key) => format!("unsupported key type: {}", key.type_of()),
        E::ValuesNotComparable(a, b) => format!(
            "no such overload: {} and {} cannot be compared",
            a.type_of(),
            b.type_of()
        ),
        E::UnsupportedBinaryOperator(op, a, b) => {
            format!("no such overload: {} {op} {}", a.type_of(), b.type_of())
        }
        E::UnsupportedIndex(index, target) => format!(
            "no such overload: {} cannot be indexed by {}",
            target.type_of(),
            index.type_of()
        ),
        E::DivisionByZero(_) => "division by zero".to_owned(),
        E::RemainderByZero(_) => "modulus by zero".to_owned(),
        E::Overflow(op, a, b) => format!("{} {op} {} overflows", a.type_of(), b.type_of()),
        E::IndexOutOfBounds(_) => "index out of bounds".to_owned(),
        E::DuplicateKey(key) => format!("repeated key of type {} in a map literal", key.type_of()),
        // Kubernetes' libraries word their own errors; the crate's prefix adds nothing.
        E::FunctionError { message, .. } => message.clone(),
        // The rest name no values.
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn programs_are_compiled_once() {
        let a = compile("self.x > 1 && self.y.startsWith('a')").unwrap();
        let b = compile("self.x > 1 && self.y.startsWith('a')").unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert!(a.uses_variable("self"));
        assert!(!a.uses_variable("oldSelf"));
        assert!(matches!(compile("self.x =="), Err(Error::Compile(_))));
    }

    #[test]
    fn integers_of_objects_are_ints() {
        let object = json!({"spec": {"replicas": 3, "ratio": 0.5, "offset": -2}});
        let mut budget = Budget::new(PER_CALL_LIMIT);
        for rule in [
            "object.spec.replicas * 2 == 6",
            "object.spec.replicas + object.spec.offset == 1",
            "type(object.spec.replicas) == int",
            "object.spec.ratio < 1.0",
        ] {
            assert_eq!(
                evaluate_bool(rule, &[("object", &object)], None, &mut budget),
                Ok(true),
                "{rule}"
            );
        }
    }

    #[test]
    fn evaluation_draws_from_the_budget() {
        let v = json!({"items": [1, 2, 3]});
        let mut budget = Budget::new(1000);
        let ok = evaluate_bool(
            "self.items.all(i, i > 0)",
            &[("self", &v)],
            None,
            &mut budget,
        );
        assert_eq!(ok, Ok(true));
        assert!(budget.remaining() < 1000, "{budget:?}");
        let mut tiny = Budget::new(1);
        assert_eq!(
            evaluate_bool("self.items.all(i, i > 0)", &[("self", &v)], None, &mut tiny),
            Err(Error::BudgetExhausted)
        );
        assert!(tiny.exhausted());
    }

    #[test]
    fn an_expression_over_the_per_call_limit_is_refused() {
        let big: Vec<i64> = (0..2000).collect();
        let v = json!({ "items": big });
        let mut budget = Budget::per_request();
        let nested = "self.items.all(a, self.items.all(b, a + b >= 0))";
        assert_eq!(
            evaluate_bool(nested, &[("self", &v)], None, &mut budget),
            Err(Error::CallCostExceeded)
        );
        assert_eq!(
            Error::CallCostExceeded.to_string(),
            ACTUAL_COST_LIMIT_EXCEEDED
        );
        // The same expression over a short list runs.
        let small = json!({"items": [1, 2, 3]});
        let mut budget = Budget::per_request();
        assert_eq!(
            evaluate_bool(nested, &[("self", &small)], None, &mut budget),
            Ok(true)
        );
    }

    #[test]
    fn locations_count_lines_and_columns() {
        let p = compile("self.a &&\n  self.bb").unwrap();
        let cel::common::ast::Expr::Call(call) = &p.expression().expr else {
            panic!("{:?}", p.expression());
        };
        let (line, _) = p.location(call.args[1].id).unwrap();
        assert_eq!(line, 2);
    }
}
