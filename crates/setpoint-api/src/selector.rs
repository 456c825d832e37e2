//! Label and field selectors, parsed and matched the way the Kubernetes API server does.
//!
//! - [`LabelSelector`]: the `labelSelector` query string (`app=web,tier!=db,env in (a,b),!x`)
//!   and `metav1.LabelSelector` objects (`matchLabels` + `matchExpressions`), which both become
//!   the same list of [`Requirement`]s. [`LabelSelector`]'s `Display` is Kubernetes' canonical
//!   string, which `kubectl` shows for `spec.selector` and Scale's `status.selector` carries.
//! - [`FieldSelector`]: the `fieldSelector` query string (`metadata.name=x,status.phase!=Failed`),
//!   with backslash escapes for `\`, `,` and `=` in values.
//!
//! Errors carry upstream's wording (`unable to parse requirement: …`), since clients show them
//! verbatim in 400 responses.

use std::fmt;

use serde_json::{Map, Value};

use crate::names;

/// A selector that does not parse, or a `metav1.LabelSelector` that does not convert.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SelectorError {
    /// The error in upstream's words (`invalid selector: …`), shown as the error's text.
    pub message: String,
}

impl SelectorError {
    fn new(message: impl Into<String>) -> Self {
        SelectorError {
            message: message.into(),
        }
    }
}

/// The operator of one label requirement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Operator {
    /// `k=v`
    Equals,
    /// `k==v` (same meaning as `=`, kept to render back as written)
    DoubleEquals,
    /// `k!=v`
    NotEquals,
    /// `k in (a,b)`
    In,
    /// `k notin (a,b)`
    NotIn,
    /// `k`
    Exists,
    /// `!k`
    DoesNotExist,
    /// `k>5` (integer comparison)
    GreaterThan,
    /// `k<5` (integer comparison)
    LessThan,
}

impl Operator {
    /// The operator's name as upstream spells it (`selection.Operator`): `=`, `in`, `gt`, ….
    pub fn as_str(self) -> &'static str {
        match self {
            Operator::Equals => "=",
            Operator::DoubleEquals => "==",
            Operator::NotEquals => "!=",
            Operator::In => "in",
            Operator::NotIn => "notin",
            Operator::Exists => "exists",
            Operator::DoesNotExist => "!",
            Operator::GreaterThan => "gt",
            Operator::LessThan => "lt",
        }
    }
}

/// One `key op values` term of a label selector. Values are kept sorted and de-duplicated, as
/// upstream keeps them in a string set.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Requirement {
    key: String,
    operator: Operator,
    values: Vec<String>,
}

/// Go's `%#v` rendering of a `[]string`, which upstream prints in requirement errors.
fn go_string_slice(values: &[String]) -> String {
    let quoted: Vec<String> = values.iter().map(|v| format!("{v:?}")).collect();
    format!("[]string{{{}}}", quoted.join(", "))
}

/// Joins field errors the way `utilerrors.NewAggregate` prints them.
fn aggregate(errs: Vec<String>) -> String {
    if errs.len() == 1 {
        errs.into_iter().next().unwrap_or_default()
    } else {
        format!("[{}]", errs.join(", "))
    }
}

fn validate_label_key(key: &str) -> Result<(), String> {
    names::is_qualified_name(key)
        .map_err(|errs| format!("key: Invalid value: {key:?}: {}", errs.join("; ")))
}

impl Requirement {
    /// A requirement, validated as upstream's `labels.NewRequirement`: the key must be a qualified
    /// name, every value a label value, and the number of values must suit the operator.
    pub fn new(
        key: impl Into<String>,
        operator: Operator,
        values: impl IntoIterator<Item = impl Into<String>>,
    ) -> Result<Requirement, SelectorError> {
        let key = key.into();
        let mut values: Vec<String> = values.into_iter().map(Into::into).collect();
        let mut errs = Vec::new();
        if let Err(e) = validate_label_key(&key) {
            errs.push(e);
        }
        let shown = go_string_slice(&values);
        match operator {
            Operator::In | Operator::NotIn => {
                if values.is_empty() {
                    errs.push(format!(
                        "values: Invalid value: {shown}: for 'in', 'notin' operators, values set can't be empty"
                    ));
                }
            }
            Operator::Equals | Operator::DoubleEquals | Operator::NotEquals => {
                if values.len() != 1 {
                    errs.push(format!(
                        "values: Invalid value: {shown}: exact-match compatibility requires one single value"
                    ));
                }
            }
            Operator::Exists | Operator::DoesNotExist => {
                if !values.is_empty() {
                    errs.push(format!(
                        "values: Invalid value: {shown}: values set must be empty for exists and does not exist"
                    ));
                }
            }
            Operator::GreaterThan | Operator::LessThan => {
                if values.len() != 1 {
                    errs.push(format!(
                        "values: Invalid value: {shown}: for 'Gt', 'Lt' operators, exactly one value is required"
                    ));
                }
                for (i, v) in values.iter().enumerate() {
                    if v.parse::<i64>().is_err() {
                        errs.push(format!(
                            "values[{i}]: Invalid value: {v:?}: for 'Gt', 'Lt' operators, the value must be an integer"
                        ));
                    }
                }
            }
        }
        for (i, v) in values.iter().enumerate() {
            if let Err(msgs) = names::is_valid_label_value(v) {
                errs.push(format!(
                    "values[{i}][{key}]: Invalid value: {v:?}: {}",
                    msgs.join("; ")
                ));
            }
        }
        if !errs.is_empty() {
            return Err(SelectorError::new(aggregate(errs)));
        }
        values.sort();
        values.dedup();
        Ok(Requirement {
            key,
            operator,
            values,
        })
    }

    /// The label key the requirement tests.
    pub fn key(&self) -> &str {
        &self.key
    }
    /// How the key's value is tested.
    pub fn operator(&self) -> Operator {
        self.operator
    }
    /// The values, sorted.
    pub fn values(&self) -> &[String] {
        &self.values
    }

    /// Whether a label set satisfies this requirement; `get` looks a label up by key.
    pub fn matches<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        let has = |v: &str| self.values.iter().any(|x| x == v);
        match self.operator {
            Operator::Equals | Operator::DoubleEquals | Operator::In => {
                get(&self.key).is_some_and(has)
            }
            Operator::NotEquals | Operator::NotIn => get(&self.key).is_none_or(|v| !has(v)),
            Operator::Exists => get(&self.key).is_some(),
            Operator::DoesNotExist => get(&self.key).is_none(),
            Operator::GreaterThan | Operator::LessThan => {
                // A label that is missing or not an integer never satisfies a comparison.
                let Some(actual) = get(&self.key).and_then(|v| v.parse::<i64>().ok()) else {
                    return false;
                };
                let Some(bound) = self.values.first().and_then(|v| v.parse::<i64>().ok()) else {
                    return false;
                };
                if self.operator == Operator::GreaterThan {
                    actual > bound
                } else {
                    actual < bound
                }
            }
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let k = &self.key;
        let first = self.values.first().map(String::as_str).unwrap_or("");
        match self.operator {
            Operator::Exists => write!(f, "{k}"),
            Operator::DoesNotExist => write!(f, "!{k}"),
            Operator::Equals => write!(f, "{k}={first}"),
            Operator::DoubleEquals => write!(f, "{k}=={first}"),
            Operator::NotEquals => write!(f, "{k}!={first}"),
            Operator::GreaterThan => write!(f, "{k}>{first}"),
            Operator::LessThan => write!(f, "{k}<{first}"),
            Operator::In => write!(f, "{k} in ({})", self.values.join(",")),
            Operator::NotIn => write!(f, "{k} notin ({})", self.values.join(",")),
        }
    }
}

/// A label selector: requirements that must all hold (AND), sorted by key.
///
/// The empty selector matches everything. A `null` `metav1.LabelSelector` converts to the
/// selector that matches nothing ([`LabelSelector::nothing`]), as upstream.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
    nothing: bool,
}

impl LabelSelector {
    /// The selector that matches every label set.
    pub fn everything() -> Self {
        LabelSelector::default()
    }

    /// The selector that matches no label set (what a missing `metav1.LabelSelector` means).
    pub fn nothing() -> Self {
        LabelSelector {
            requirements: Vec::new(),
            nothing: true,
        }
    }

    /// A selector from requirements, sorted by key as upstream's `Selector.Add` does (stable, so
    /// requirements on one key keep their order).
    pub fn from_requirements(mut requirements: Vec<Requirement>) -> Self {
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        LabelSelector {
            requirements,
            nothing: false,
        }
    }

    /// Parses the string form (`labelSelector=` query parameter).
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let tokens = lex(s);
        let mut p = Parser { tokens, pos: 0 };
        let reqs = p.parse()?;
        Ok(LabelSelector::from_requirements(reqs))
    }

    /// Converts a `metav1.LabelSelector` JSON object (`matchLabels`, `matchExpressions` with
    /// `In`/`NotIn`/`Exists`/`DoesNotExist`). `null` matches nothing; `{}` matches everything.
    pub fn from_label_selector_json(v: &Value) -> Result<Self, SelectorError> {
        let obj = match v {
            Value::Null => return Ok(LabelSelector::nothing()),
            Value::Object(o) => o,
            other => {
                return Err(SelectorError::new(format!(
                    "a label selector must be an object, not {other}"
                )))
            }
        };
        let mut reqs = Vec::new();
        match obj.get("matchLabels") {
            None | Some(Value::Null) => {}
            Some(Value::Object(labels)) => {
                for (k, v) in labels {
                    let Some(v) = v.as_str() else {
                        return Err(SelectorError::new(format!(
                            "matchLabels[{k}]: must be a string, not {v}"
                        )));
                    };
                    reqs.push(Requirement::new(k.as_str(), Operator::Equals, [v])?);
                }
            }
            Some(other) => {
                return Err(SelectorError::new(format!(
                    "matchLabels must be an object, not {other}"
                )))
            }
        }
        match obj.get("matchExpressions") {
            None | Some(Value::Null) => {}
            Some(Value::Array(exprs)) => {
                for expr in exprs {
                    reqs.push(expression_requirement(expr)?);
                }
            }
            Some(other) => {
                return Err(SelectorError::new(format!(
                    "matchExpressions must be an array, not {other}"
                )))
            }
        }
        Ok(LabelSelector::from_requirements(reqs))
    }

    /// The canonical string of a `metav1.LabelSelector` (Scale `status.selector`, `kubectl
    /// describe`'s `Selector:`).
    pub fn label_selector_json_to_string(v: &Value) -> Result<String, SelectorError> {
        Ok(LabelSelector::from_label_selector_json(v)?.to_string())
    }

    /// Whether this selector matches everything (no requirements).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty() && !self.nothing
    }

    /// Whether this is the match-nothing selector.
    pub fn is_nothing(&self) -> bool {
        self.nothing
    }

    /// The requirements, all of which must hold, sorted by key; empty for both the
    /// match-everything and the match-nothing selector.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// Whether the labels looked up by `get` satisfy every requirement.
    pub fn matches<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        !self.nothing && self.requirements.iter().all(|r| r.matches(&get))
    }

    /// Whether a JSON label map (`metadata.labels`) satisfies the selector; non-string values
    /// count as absent.
    pub fn matches_map(&self, labels: &Map<String, Value>) -> bool {
        self.matches(|k| labels.get(k).and_then(Value::as_str))
    }

    /// Whether an object's `metadata.labels` satisfy the selector.
    pub fn matches_object(&self, obj: &Value) -> bool {
        let labels = obj
            .get("metadata")
            .and_then(|m| m.get("labels"))
            .and_then(Value::as_object);
        self.matches(|k| labels.and_then(|l| l.get(k)).and_then(Value::as_str))
    }

    /// For each key this selector pins to one value with `=`/`==`/one-value `in`, that value;
    /// the labels an object must carry to be selected.
    pub fn required_labels(&self) -> Vec<(&str, &str)> {
        self.requirements
            .iter()
            .filter(|r| {
                matches!(r.operator, Operator::Equals | Operator::DoubleEquals)
                    || (r.operator == Operator::In && r.values.len() == 1)
            })
            .map(|r| (r.key.as_str(), r.values[0].as_str()))
            .collect()
    }
}

fn expression_requirement(expr: &Value) -> Result<Requirement, SelectorError> {
    let key = expr.get("key").and_then(Value::as_str).unwrap_or("");
    let op_name = expr.get("operator").and_then(Value::as_str).unwrap_or("");
    let op = match op_name {
        "In" => Operator::In,
        "NotIn" => Operator::NotIn,
        "Exists" => Operator::Exists,
        "DoesNotExist" => Operator::DoesNotExist,
        other => {
            return Err(SelectorError::new(format!(
                "{other:?} is not a valid label selector operator"
            )))
        }
    };
    let values: Vec<String> = match expr.get("values") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(vs)) => vs
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| SelectorError::new(format!("values: must be strings, not {v}")))
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(SelectorError::new(format!(
                "values must be an array, not {other}"
            )))
        }
    };
    Requirement::new(key, op, values)
}

impl fmt::Display for LabelSelector {
    /// Requirements joined with `,` (the empty selector renders as `""`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for LabelSelector {
    type Err = SelectorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        LabelSelector::parse(s)
    }
}

// ---- label selector lexer and parser (mirrors upstream's grammar and error texts) ----

#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    Identifier,
    Bang,
    Equals,
    DoubleEquals,
    NotEquals,
    GreaterThan,
    LessThan,
    In,
    NotIn,
    OpenPar,
    ClosedPar,
    Comma,
    End,
    Error,
}

/// Characters that end an identifier and start an operator token.
fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '>' | '<')
}

fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

fn special_token(s: &str) -> Option<Tok> {
    Some(match s {
        "!" => Tok::Bang,
        "!=" => Tok::NotEquals,
        "(" => Tok::OpenPar,
        ")" => Tok::ClosedPar,
        "," => Tok::Comma,
        "=" => Tok::Equals,
        "==" => Tok::DoubleEquals,
        ">" => Tok::GreaterThan,
        "<" => Tok::LessThan,
        _ => return None,
    })
}

/// Splits a selector string into (token, literal) pairs, ending with `End`.
fn lex(s: &str) -> Vec<(Tok, String)> {
    let chars: Vec<char> = s.chars().collect();
    let mut i = 0;
    let mut out = Vec::new();
    loop {
        while i < chars.len() && is_space(chars[i]) {
            i += 1;
        }
        if i >= chars.len() {
            out.push((Tok::End, String::new()));
            return out;
        }
        if is_special(chars[i]) {
            // Longest run of special characters that still forms a token (`!=` over `!`).
            let mut buf = String::new();
            let mut best: Option<(Tok, String, usize)> = None;
            let mut j = i;
            while j < chars.len() && is_special(chars[j]) {
                buf.push(chars[j]);
                j += 1;
                if let Some(t) = special_token(&buf) {
                    best = Some((t, buf.clone(), j));
                } else if best.is_some() {
                    break;
                }
            }
            match best {
                Some((t, lit, end)) => {
                    out.push((t, lit));
                    i = end;
                }
                None => {
                    out.push((Tok::Error, format!("error expected: keyword found '{buf}'")));
                    out.push((Tok::End, String::new()));
                    return out;
                }
            }
        } else {
            let start = i;
            while i < chars.len() && !is_space(chars[i]) && !is_special(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let t = match word.as_str() {
                "in" => Tok::In,
                "notin" => Tok::NotIn,
                _ => Tok::Identifier,
            };
            out.push((t, word));
        }
    }
}

/// Where a token is read: after a key, `in`/`notin` are operators; elsewhere they are plain
/// identifiers (a value or key may be spelled `in`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ctx {
    KeyAndOperator,
    Values,
}

struct Parser {
    tokens: Vec<(Tok, String)>,
    pos: usize,
}

const BINARY_OPERATORS: &str = "in, notin, =, ==, !=, gt, lt";

impl Parser {
    fn peek(&self, ctx: Ctx) -> (Tok, String) {
        let (t, lit) = self
            .tokens
            .get(self.pos)
            .cloned()
            .unwrap_or((Tok::End, String::new()));
        (Self::in_ctx(t, ctx), lit)
    }

    fn next(&mut self, ctx: Ctx) -> (Tok, String) {
        let out = self.peek(ctx);
        if self.pos < self.tokens.len() {
            self.pos += 1;
        }
        out
    }

    fn in_ctx(t: Tok, ctx: Ctx) -> Tok {
        match (t, ctx) {
            (Tok::In | Tok::NotIn, Ctx::Values) => Tok::Identifier,
            (t, _) => t,
        }
    }

    fn parse(&mut self) -> Result<Vec<Requirement>, SelectorError> {
        let mut reqs = Vec::new();
        loop {
            let (t, lit) = self.peek(Ctx::Values);
            match t {
                Tok::Identifier | Tok::Bang => {
                    let r = self.requirement().map_err(|e| {
                        SelectorError::new(format!("unable to parse requirement: {e}"))
                    })?;
                    reqs.push(r);
                    let (t, lit) = self.next(Ctx::Values);
                    match t {
                        Tok::End => return Ok(reqs),
                        Tok::Comma => {
                            let (t2, lit2) = self.peek(Ctx::Values);
                            if t2 != Tok::Identifier && t2 != Tok::Bang {
                                return Err(SelectorError::new(format!(
                                    "found '{lit2}', expected: identifier after ','"
                                )));
                            }
                        }
                        _ => {
                            return Err(SelectorError::new(format!(
                                "found '{lit}', expected: ',' or 'end of string'"
                            )))
                        }
                    }
                }
                Tok::End => return Ok(reqs),
                _ => {
                    return Err(SelectorError::new(format!(
                        "found '{lit}', expected: !, identifier, or 'end of string'"
                    )))
                }
            }
        }
    }

    fn requirement(&mut self) -> Result<Requirement, String> {
        let (key, inferred) = self.key_and_inferred_operator()?;
        if let Some(op) = inferred {
            return Requirement::new(key, op, Vec::<String>::new()).map_err(|e| e.message);
        }
        let op = self.operator()?;
        let values = match op {
            Operator::In | Operator::NotIn => self.values()?,
            _ => vec![self.exact_value()?],
        };
        Requirement::new(key, op, values).map_err(|e| e.message)
    }

    /// Reads `!key` or `key`; the operator is known already when the key stands alone.
    fn key_and_inferred_operator(&mut self) -> Result<(String, Option<Operator>), String> {
        let mut op = None;
        let (mut t, mut lit) = self.next(Ctx::Values);
        if t == Tok::Bang {
            op = Some(Operator::DoesNotExist);
            (t, lit) = self.next(Ctx::Values);
        }
        if t != Tok::Identifier {
            return Err(format!("found '{lit}', expected: identifier"));
        }
        validate_label_key(&lit)?;
        let (after, _) = self.peek(Ctx::Values);
        if (after == Tok::End || after == Tok::Comma) && op.is_none() {
            op = Some(Operator::Exists);
        }
        Ok((lit, op))
    }

    fn operator(&mut self) -> Result<Operator, String> {
        let (t, lit) = self.next(Ctx::KeyAndOperator);
        Ok(match t {
            Tok::In => Operator::In,
            Tok::NotIn => Operator::NotIn,
            Tok::Equals => Operator::Equals,
            Tok::DoubleEquals => Operator::DoubleEquals,
            Tok::NotEquals => Operator::NotEquals,
            Tok::GreaterThan => Operator::GreaterThan,
            Tok::LessThan => Operator::LessThan,
            _ => return Err(format!("found '{lit}', expected: {BINARY_OPERATORS}")),
        })
    }

    /// `(a,b)`; `()` means the one value `""`, and empty list entries are `""` too.
    fn values(&mut self) -> Result<Vec<String>, String> {
        let (t, lit) = self.next(Ctx::Values);
        if t != Tok::OpenPar {
            return Err(format!("found '{lit}' expected: '('"));
        }
        let (t, lit) = self.peek(Ctx::Values);
        match t {
            Tok::Identifier | Tok::Comma => {
                let vals = self.identifier_list()?;
                let (t, lit) = self.next(Ctx::Values);
                if t != Tok::ClosedPar {
                    return Err(format!("found '{lit}', expected: ')'"));
                }
                Ok(vals)
            }
            Tok::ClosedPar => {
                self.next(Ctx::Values);
                Ok(vec![String::new()])
            }
            _ => Err(format!("found '{lit}', expected: ',', ')' or identifier")),
        }
    }

    fn identifier_list(&mut self) -> Result<Vec<String>, String> {
        let mut vals: Vec<String> = Vec::new();
        loop {
            let (t, lit) = self.next(Ctx::Values);
            match t {
                Tok::Identifier => {
                    vals.push(lit);
                    let (t2, lit2) = self.peek(Ctx::Values);
                    match t2 {
                        Tok::Comma => continue,
                        Tok::ClosedPar => return Ok(vals),
                        _ => return Err(format!("found '{lit2}', expected: ',' or ')'")),
                    }
                }
                Tok::Comma => {
                    // `(,a)`, `(a,)` and `(a,,b)` all hold the empty value.
                    if vals.is_empty() {
                        vals.push(String::new());
                    }
                    let (t2, _) = self.peek(Ctx::Values);
                    if t2 == Tok::ClosedPar {
                        vals.push(String::new());
                        return Ok(vals);
                    }
                    if t2 == Tok::Comma {
                        self.next(Ctx::Values);
                        vals.push(String::new());
                    }
                }
                _ => return Err(format!("found '{lit}', expected: ',', or identifier")),
            }
        }
    }

    /// The value after `=`, `==`, `!=`, `>` or `<`; nothing (end or `,`) is the empty value.
    fn exact_value(&mut self) -> Result<String, String> {
        let (t, _) = self.peek(Ctx::Values);
        if t == Tok::End || t == Tok::Comma {
            return Ok(String::new());
        }
        let (t, lit) = self.next(Ctx::Values);
        if t == Tok::Identifier {
            Ok(lit)
        } else {
            Err(format!("found '{lit}', expected: identifier"))
        }
    }
}

// ---- field selectors ----

/// The operator of one field requirement (`==` parses as [`FieldOperator::Equals`], as upstream).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FieldOperator {
    /// `field=value` (or `field==value`): the field's value equals the given one.
    Equals,
    /// `field!=value`: the field's value differs from the given one.
    NotEquals,
}

impl FieldOperator {
    /// The operator as a selector string writes it: `=` or `!=`.
    pub fn as_str(self) -> &'static str {
        match self {
            FieldOperator::Equals => "=",
            FieldOperator::NotEquals => "!=",
        }
    }
}

/// One `field=value` or `field!=value` term, with the value unescaped.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FieldRequirement {
    /// The field path the term tests, as written (`metadata.name`, `spec.nodeName`).
    pub field: String,
    /// Whether the field must equal or differ from `value`.
    pub operator: FieldOperator,
    /// The value compared with, unescaped (`\,` in the selector string is `,` here).
    pub value: String,
}

impl fmt::Display for FieldRequirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}{}{}",
            self.field,
            self.operator.as_str(),
            escape_field_value(&self.value)
        )
    }
}

/// A field selector: terms that must all hold. The empty selector matches everything.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct FieldSelector {
    requirements: Vec<FieldRequirement>,
}

/// Escapes `\`, `,` and `=` in a field selector value.
pub fn escape_field_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '\\' | ',' | '=') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Undoes [`escape_field_value`]; an unknown escape, a trailing `\` or a bare `,`/`=` is an error.
pub fn unescape_field_value(s: &str) -> Result<String, SelectorError> {
    let mut out = String::with_capacity(s.len());
    let mut escaped = false;
    for c in s.chars() {
        if escaped {
            if !matches!(c, '\\' | ',' | '=') {
                return Err(SelectorError::new(format!(
                    "invalid field selector: invalid escape sequence: \\{c}"
                )));
            }
            out.push(c);
            escaped = false;
            continue;
        }
        match c {
            '\\' => escaped = true,
            ',' | '=' => {
                return Err(SelectorError::new(format!(
                    "invalid field selector: unescaped character in value: {c}"
                )))
            }
            _ => out.push(c),
        }
    }
    if escaped {
        return Err(SelectorError::new(
            "invalid field selector: invalid escape sequence: \\",
        ));
    }
    Ok(out)
}

/// Splits on commas that are not escaped; escapes stay in the terms.
fn split_terms(s: &str) -> Vec<&str> {
    let mut terms = Vec::new();
    let mut start = 0;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == ',' {
            terms.push(&s[start..i]);
            start = i + 1;
        }
    }
    terms.push(&s[start..]);
    terms
}

/// Splits a term at the first operator; at each position `!=` and `==` win over `=`.
fn split_term(term: &str) -> Option<(&str, FieldOperator, &str)> {
    for (i, _) in term.char_indices() {
        let rest = &term[i..];
        for (op, kind) in [
            ("!=", FieldOperator::NotEquals),
            ("==", FieldOperator::Equals),
            ("=", FieldOperator::Equals),
        ] {
            if let Some(value) = rest.strip_prefix(op) {
                return Some((&term[..i], kind, value));
            }
        }
    }
    None
}

impl FieldSelector {
    /// The selector that matches everything.
    pub fn everything() -> Self {
        FieldSelector::default()
    }

    /// Parses the string form; terms are sorted as upstream sorts them, empty terms skipped.
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        if s.is_empty() {
            return Ok(FieldSelector::default());
        }
        let mut parts = split_terms(s);
        parts.sort_unstable();
        let mut requirements = Vec::new();
        for part in parts {
            if part.is_empty() {
                continue;
            }
            let Some((field, operator, raw)) = split_term(part) else {
                return Err(SelectorError::new(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                )));
            };
            let value = unescape_field_value(raw)?;
            requirements.push(FieldRequirement {
                field: field.to_string(),
                operator,
                value,
            });
        }
        Ok(FieldSelector { requirements })
    }

    /// A selector from requirements, in the given order.
    pub fn from_requirements(requirements: Vec<FieldRequirement>) -> Self {
        FieldSelector { requirements }
    }

    /// Whether the selector has no terms, and so matches every object.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The terms, all of which must hold.
    pub fn requirements(&self) -> &[FieldRequirement] {
        &self.requirements
    }

    /// Whether the fields read by `get` satisfy every term (missing fields read as `""`).
    pub fn matches(&self, get: impl Fn(&str) -> String) -> bool {
        self.requirements.iter().all(|r| {
            let actual = get(&r.field);
            match r.operator {
                FieldOperator::Equals => actual == r.value,
                FieldOperator::NotEquals => actual != r.value,
            }
        })
    }

    /// The value `field` must equal, if some term pins it (`metadata.name=x` lets a list or
    /// watch read one key instead of scanning).
    pub fn exact_match(&self, field: &str) -> Option<&str> {
        self.requirements
            .iter()
            .find(|r| r.field == field && r.operator == FieldOperator::Equals)
            .map(|r| r.value.as_str())
    }
}

impl fmt::Display for FieldSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for FieldSelector {
    type Err = SelectorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FieldSelector::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;
    use std::collections::BTreeMap;

    fn sel(s: &str) -> LabelSelector {
        LabelSelector::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn matches(s: &LabelSelector, l: &BTreeMap<String, String>) -> bool {
        s.matches(|k| l.get(k).map(String::as_str))
    }

    #[test]
    fn parses_every_operator() {
        let s = sel("app=web,tier!=db, env in (prod, dev),x notin (a),y,!z,n>3,m<10,q==r");
        assert_eq!(
            s.to_string(),
            "app=web,env in (dev,prod),m<10,n>3,q==r,tier!=db,x notin (a),y,!z"
        );
        let ops: Vec<Operator> = s.requirements().iter().map(Requirement::operator).collect();
        assert_eq!(
            ops,
            vec![
                Operator::Equals,
                Operator::In,
                Operator::LessThan,
                Operator::GreaterThan,
                Operator::DoubleEquals,
                Operator::NotEquals,
                Operator::NotIn,
                Operator::Exists,
                Operator::DoesNotExist
            ]
        );
    }

    #[test]
    fn whitespace_and_empty() {
        assert!(sel("").is_empty());
        assert!(sel("   ").is_empty());
        assert_eq!(sel("  a = b ,  c  ").to_string(), "a=b,c");
        assert_eq!(sel("a=").to_string(), "a=");
        assert_eq!(sel("a in ()").requirements()[0].values(), &["".to_string()]);
        assert_eq!(sel("a in (,b)").to_string(), "a in (,b)");
        // `in` is an operator after a key but a plain word elsewhere.
        assert_eq!(sel("in=in").to_string(), "in=in");
        assert_eq!(sel("a in (in,notin)").to_string(), "a in (in,notin)");
    }

    #[test]
    fn matching() {
        let l = labels(&[("app", "web"), ("tier", "front"), ("n", "5")]);
        assert!(matches(&sel("app=web"), &l));
        assert!(!matches(&sel("app=db"), &l));
        assert!(matches(&sel("app!=db"), &l));
        assert!(matches(&sel("missing!=x"), &l));
        assert!(matches(&sel("app in (web,db)"), &l));
        assert!(!matches(&sel("missing in (web)"), &l));
        assert!(matches(&sel("missing notin (web)"), &l));
        assert!(!matches(&sel("app notin (web)"), &l));
        assert!(matches(&sel("app,!missing"), &l));
        assert!(!matches(&sel("!app"), &l));
        assert!(matches(&sel("n>4,n<6"), &l));
        assert!(!matches(&sel("app>1"), &l));
        assert!(matches(&sel(""), &l));
        assert!(!matches(&sel("app=web,tier=back"), &l));
        assert!(!LabelSelector::nothing().matches(|_| None));
        let obj = json!({"metadata": {"labels": {"app": "web"}}});
        assert!(sel("app=web").matches_object(&obj));
        assert!(!sel("app=web").matches_object(&json!({})));
        assert!(sel("app=web").matches_map(obj["metadata"]["labels"].as_object().unwrap()));
    }

    #[test]
    fn parse_errors_use_upstream_wording() {
        let e = LabelSelector::parse("a b").unwrap_err().message;
        assert_eq!(
            e,
            "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt"
        );
        let e = LabelSelector::parse("a in b").unwrap_err().message;
        assert_eq!(e, "unable to parse requirement: found 'b' expected: '('");
        let e = LabelSelector::parse("a=b c").unwrap_err().message;
        assert_eq!(e, "found 'c', expected: ',' or 'end of string'");
        let e = LabelSelector::parse("a=b,").unwrap_err().message;
        assert_eq!(e, "found '', expected: identifier after ','");
        let e = LabelSelector::parse(",a").unwrap_err().message;
        assert_eq!(e, "found ',', expected: !, identifier, or 'end of string'");
        let e = LabelSelector::parse("a=b=c").unwrap_err().message;
        assert_eq!(e, "found '=', expected: ',' or 'end of string'");
        let e = LabelSelector::parse("-a=b").unwrap_err().message;
        assert!(
            e.starts_with(
                "unable to parse requirement: key: Invalid value: \"-a\": name part must consist"
            ),
            "{e}"
        );
        let e = LabelSelector::parse("a=-b").unwrap_err().message;
        assert!(
            e.starts_with(
                "unable to parse requirement: values[0][a]: Invalid value: \"-b\": a valid label"
            ),
            "{e}"
        );
        let e = LabelSelector::parse("a>b").unwrap_err().message;
        assert!(
            e.contains("for 'Gt', 'Lt' operators, the value must be an integer"),
            "{e}"
        );
        let e = LabelSelector::parse("a in (b c)").unwrap_err().message;
        assert_eq!(
            e,
            "unable to parse requirement: found 'c', expected: ',' or ')'"
        );
        assert!(LabelSelector::parse("a=(").is_err());
        assert!(LabelSelector::parse("!").is_err());
        assert!(LabelSelector::parse("a in (b").is_err());
    }

    #[test]
    fn from_metav1_label_selector() {
        let v = json!({
            "matchLabels": {"app": "web", "tier": "front"},
            "matchExpressions": [
                {"key": "env", "operator": "In", "values": ["prod", "dev"]},
                {"key": "canary", "operator": "DoesNotExist"},
                {"key": "zone", "operator": "Exists"},
                {"key": "b", "operator": "NotIn", "values": ["x"]}
            ]
        });
        let s = LabelSelector::from_label_selector_json(&v).unwrap();
        assert_eq!(
            s.to_string(),
            "app=web,b notin (x),!canary,env in (dev,prod),tier=front,zone"
        );
        assert_eq!(
            LabelSelector::label_selector_json_to_string(&json!({"matchLabels": {"app": "x"}}))
                .unwrap(),
            "app=x"
        );
        assert!(LabelSelector::from_label_selector_json(&json!({}))
            .unwrap()
            .is_empty());
        let nothing = LabelSelector::from_label_selector_json(&Value::Null).unwrap();
        assert!(nothing.is_nothing() && !nothing.is_empty());
        let e = LabelSelector::from_label_selector_json(
            &json!({"matchExpressions": [{"key": "a", "operator": "Gt"}]}),
        )
        .unwrap_err();
        assert_eq!(e.message, "\"Gt\" is not a valid label selector operator");
        let e = LabelSelector::from_label_selector_json(
            &json!({"matchExpressions": [{"key": "a", "operator": "In"}]}),
        )
        .unwrap_err();
        assert_eq!(e.message, "values: Invalid value: []string{}: for 'in', 'notin' operators, values set can't be empty");
        let e = LabelSelector::from_label_selector_json(
            &json!({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}),
        )
        .unwrap_err();
        assert!(e
            .message
            .contains("values set must be empty for exists and does not exist"));
        assert!(
            LabelSelector::from_label_selector_json(&json!({"matchLabels": {"a": 1}})).is_err()
        );
        assert!(
            LabelSelector::from_label_selector_json(&json!({"matchLabels": {"a b": "c"}})).is_err()
        );
    }

    #[test]
    fn required_labels_lists_pinned_keys() {
        let s = sel("a=1,b in (2),c in (3,4),d!=5,e");
        assert_eq!(s.required_labels(), vec![("a", "1"), ("b", "2")]);
    }

    #[test]
    fn field_selectors() {
        let f = FieldSelector::parse(
            "spec.nodeName=node-1,status.phase!=Succeeded,status.phase!=Failed",
        )
        .unwrap();
        assert_eq!(f.requirements().len(), 3);
        assert_eq!(f.exact_match("spec.nodeName"), Some("node-1"));
        assert_eq!(f.exact_match("status.phase"), None);
        let get = |phase: &'static str| {
            move |field: &str| {
                if field == "status.phase" {
                    phase.to_string()
                } else {
                    "node-1".to_string()
                }
            }
        };
        assert!(f.matches(get("Running")));
        assert!(!f.matches(get("Failed")));
        let f = FieldSelector::parse("metadata.name==web").unwrap();
        assert_eq!(f.exact_match("metadata.name"), Some("web"));
        assert_eq!(f.to_string(), "metadata.name=web");
        assert!(FieldSelector::parse("").unwrap().is_empty());
        assert!(FieldSelector::parse("a=b,").unwrap().requirements().len() == 1);
        assert!(FieldSelector::everything().matches(|_| String::new()));
    }

    #[test]
    fn field_selector_escapes() {
        let f = FieldSelector::parse(r"a=x\,y\=z\\w").unwrap();
        assert_eq!(f.requirements()[0].value, r"x,y=z\w");
        assert_eq!(f.to_string(), r"a=x\,y\=z\\w");
        let f = FieldSelector::parse("a=b!c").unwrap();
        assert_eq!(f.requirements()[0].value, "b!c");
        let f = FieldSelector::parse("a!==x").unwrap_err();
        assert_eq!(
            f.message,
            "invalid field selector: unescaped character in value: ="
        );
        let e = FieldSelector::parse(r"a=\q").unwrap_err();
        assert_eq!(
            e.message,
            r"invalid field selector: invalid escape sequence: \q"
        );
        let e = FieldSelector::parse(r"a=b\").unwrap_err();
        assert_eq!(
            e.message,
            r"invalid field selector: invalid escape sequence: \"
        );
        let e = FieldSelector::parse("abc").unwrap_err();
        assert_eq!(e.message, "invalid selector: 'abc'; can't understand 'abc'");
    }

    // ---- property tests ----

    fn key_strategy() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z]([a-z0-9_.-]{0,6}[a-z0-9])?",
            "[a-z]{1,4}\\.io/[A-Za-z]([A-Za-z0-9_.-]{0,4}[A-Za-z0-9])?",
            Just("in".to_string()),
            Just("notin".to_string()),
        ]
    }

    fn value_strategy() -> impl Strategy<Value = String> {
        prop_oneof![
            "[A-Za-z0-9]([A-Za-z0-9_.-]{0,6}[A-Za-z0-9])?",
            Just(String::new()),
            Just("in".to_string())
        ]
    }

    fn requirement_strategy() -> impl Strategy<Value = Requirement> {
        let ops = prop_oneof![
            Just(Operator::Equals),
            Just(Operator::DoubleEquals),
            Just(Operator::NotEquals),
            Just(Operator::In),
            Just(Operator::NotIn),
            Just(Operator::Exists),
            Just(Operator::DoesNotExist),
            Just(Operator::GreaterThan),
            Just(Operator::LessThan),
        ];
        (
            key_strategy(),
            ops,
            proptest::collection::vec(value_strategy(), 1..4),
            0i64..100,
        )
            .prop_map(|(k, op, vals, n)| {
                let vals: Vec<String> = match op {
                    Operator::In | Operator::NotIn => vals,
                    Operator::Exists | Operator::DoesNotExist => vec![],
                    Operator::GreaterThan | Operator::LessThan => vec![n.to_string()],
                    _ => vec![vals[0].clone()],
                };
                Requirement::new(k, op, vals).expect("generated requirements are valid")
            })
    }

    /// What a requirement means, written independently of the implementation.
    fn model(r: &Requirement, l: &BTreeMap<String, String>) -> bool {
        let v = l.get(r.key());
        let vals = r.values();
        match r.operator() {
            Operator::Equals | Operator::DoubleEquals => v == Some(&vals[0]),
            Operator::In => v.map(|v| vals.contains(v)).unwrap_or(false),
            Operator::NotEquals => v != Some(&vals[0]),
            Operator::NotIn => !v.map(|v| vals.contains(v)).unwrap_or(false),
            Operator::Exists => v.is_some(),
            Operator::DoesNotExist => v.is_none(),
            Operator::GreaterThan => v
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|n| n > vals[0].parse().unwrap()),
            Operator::LessThan => v
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|n| n < vals[0].parse().unwrap()),
        }
    }

    proptest! {
        #[test]
        fn label_selector_round_trips(reqs in proptest::collection::vec(requirement_strategy(), 0..6)) {
            let s = LabelSelector::from_requirements(reqs);
            let text = s.to_string();
            let back = LabelSelector::parse(&text).map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
            prop_assert_eq!(&back, &s);
            prop_assert_eq!(back.to_string(), text);
        }

        #[test]
        fn label_selector_round_trips_with_spaces(reqs in proptest::collection::vec(requirement_strategy(), 1..5)) {
            let s = LabelSelector::from_requirements(reqs);
            let spaced = s.to_string().replace(',', " , ").replace('(', " ( ");
            prop_assert_eq!(LabelSelector::parse(&spaced).unwrap(), s);
        }

        #[test]
        fn label_matching_agrees_with_model(
            reqs in proptest::collection::vec(requirement_strategy(), 0..5),
            pairs in proptest::collection::btree_map(
                prop_oneof![key_strategy(), Just("a".to_string()), Just("in".to_string())],
                prop_oneof![value_strategy(), (0i64..100).prop_map(|n| n.to_string())],
                0..6),
        ) {
            let s = LabelSelector::from_requirements(reqs.clone());
            let expected = reqs.iter().all(|r| model(r, &pairs));
            prop_assert_eq!(matches(&s, &pairs), expected);
            // Matching does not depend on the textual form.
            let reparsed = LabelSelector::parse(&s.to_string()).unwrap();
            prop_assert_eq!(matches(&reparsed, &pairs), expected);
        }

        #[test]
        fn field_selector_round_trips(
            terms in proptest::collection::vec(
                ("[a-z][a-z.]{0,8}", prop_oneof![Just(FieldOperator::Equals), Just(FieldOperator::NotEquals)], "[a-z0-9,=!\\\\ -]{0,6}"),
                0..5)
        ) {
            let reqs: Vec<FieldRequirement> = terms
                .into_iter()
                .map(|(field, operator, value)| FieldRequirement { field, operator, value })
                .collect();
            let text = FieldSelector::from_requirements(reqs.clone()).to_string();
            let back = FieldSelector::parse(&text).map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
            let mut want = reqs.clone();
            want.sort_by_key(|r| r.to_string());
            let mut got = back.requirements().to_vec();
            got.sort_by_key(|r| r.to_string());
            prop_assert_eq!(got, want);
        }

        #[test]
        fn field_matching_agrees_with_model(
            terms in proptest::collection::vec(
                (prop_oneof![Just("a"), Just("b")], any::<bool>(), prop_oneof![Just("x"), Just("y"), Just("")]),
                0..4),
            a in prop_oneof![Just("x"), Just("y"), Just("")],
            b in prop_oneof![Just("x"), Just("y"), Just("")],
        ) {
            let reqs: Vec<FieldRequirement> = terms
                .iter()
                .map(|(f, eq, v)| FieldRequirement {
                    field: f.to_string(),
                    operator: if *eq { FieldOperator::Equals } else { FieldOperator::NotEquals },
                    value: v.to_string(),
                })
                .collect();
            let get = |f: &str| if f == "a" { a.to_string() } else { b.to_string() };
            let expected = terms.iter().all(|(f, eq, v)| (get(f) == *v) == *eq);
            let s = FieldSelector::parse(&FieldSelector::from_requirements(reqs).to_string()).unwrap();
            prop_assert_eq!(s.matches(get), expected);
        }
    }
}
