//! Decoding YAML request bodies into JSON values with a bound on what aliases can expand to.
//!
//! A YAML anchor can be referenced any number of times, and anchors can nest, so a body of a
//! kilobyte can name megabytes (a "billion laughs" document). The value is built by a visitor
//! that charges every node against a budget before allocating it, and the decode stops with
//! Kubernetes' own error for such documents as soon as the budget runs out: nothing near the
//! expanded size is ever allocated. Errors read as Kubernetes' YAML decoder words them
//! (`yaml: line N: …`), without the parser's hints about Rust types.

use std::cell::Cell;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::objects::MAX_OBJECT_BYTES;

/// What go-yaml (Kubernetes' YAML decoder) answers for a document whose aliases expand too far.
pub const EXCESSIVE_ALIASING: &str = "yaml: document contains excessive aliasing";

/// What go-yaml answers for a document nested deeper than it allows.
pub const MAX_DEPTH: &str = "yaml: exceeded max depth";

/// Decodes a YAML document into a JSON value. The value's size (as compact JSON, roughly) may
/// not exceed twice the text's or [`MAX_OBJECT_BYTES`], whichever is more: plain YAML is never
/// much smaller than its JSON, so only aliases can go past that, and no stored object can be
/// larger anyway.
pub fn decode(text: &str) -> Result<Value, String> {
    decode_with_budget(text, MAX_OBJECT_BYTES.max(text.len().saturating_mul(2)))
}

/// [`decode`] with an explicit budget in bytes.
pub fn decode_with_budget(text: &str, budget: usize) -> Result<Value, String> {
    BUDGET.with(|b| b.set(budget));
    let result =
        serde_saphyr::from_str_with_options::<Bounded>(text, crate::dupfields::yaml_options());
    let exhausted = BUDGET.with(|b| b.replace(0)) == EXHAUSTED;
    let e = match result {
        Ok(Bounded(v)) => return Ok(v),
        Err(_) if exhausted => return Err(EXCESSIVE_ALIASING.to_string()),
        Err(e) => e,
    };
    match original(&e) {
        serde_saphyr::Error::Budget { breach, .. } => Err(match breach {
            serde_saphyr::budget::BudgetBreach::Depth { .. } => format!(
                "{MAX_DEPTH} of {}",
                serde_saphyr::budget::Budget::default().max_depth
            ),
            // The parser's own caps on events, nodes and aliases (which count what aliases
            // replay) are met by the same documents.
            _ => EXCESSIVE_ALIASING.to_string(),
        }),
        _ => Err(describe(&e)),
    }
}

/// The error an alias replay or a source snippet wraps.
fn original(mut e: &serde_saphyr::Error) -> &serde_saphyr::Error {
    #[allow(deprecated)] // Only the wrapped error is read.
    while let serde_saphyr::Error::AliasError { error, .. }
    | serde_saphyr::Error::WithSnippet { error, .. } = e
    {
        e = error;
    }
    e
}

/// Marks a budget that ran out (a real budget never reaches it: it only decreases from a size).
const EXHAUSTED: usize = usize::MAX;

thread_local! {
    /// What the decode on this thread may still build. A decode runs on one thread from start to
    /// end (it is synchronous), so a thread-local is the budget of exactly one decode.
    static BUDGET: Cell<usize> = const { Cell::new(0) };
}

/// Takes `n` bytes from the budget, failing (and marking it exhausted) when there are not
/// enough left.
fn charge<E: de::Error>(n: usize) -> Result<(), E> {
    BUDGET.with(|b| {
        let left = b.get();
        if left == EXHAUSTED || left < n {
            b.set(EXHAUSTED);
            Err(E::custom(EXCESSIVE_ALIASING))
        } else {
            b.set(left - n);
            Ok(())
        }
    })
}

/// The parser's message in Kubernetes' words: `yaml: line N: <what>`, without the hints the
/// parser adds for Rust programmers (`; use Option<String>`, `set DuplicateKeyPolicy …`).
fn describe(e: &serde_saphyr::Error) -> String {
    let text = e.without_snippet().to_string();
    let first = text.lines().next().unwrap_or_default();
    // The location is reported separately below, and the parser's own suffix names it again.
    let what = match first.find(" at line ") {
        Some(i) => &first[..i],
        None => first,
    };
    let what = what.split("; ").next().unwrap_or(what);
    let what = what.split(", set ").next().unwrap_or(what).trim();
    match e.location() {
        Some(at) if at.line() > 0 => format!("yaml: line {}: {what}", at.line()),
        _ => format!("yaml: {what}"),
    }
}

/// A JSON value built under the budget.
struct Bounded(Value);

impl<'de> de::Deserialize<'de> for Bounded {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ValueVisitor).map(Bounded)
    }
}

/// Builds the same values `serde_json::Value`'s own visitor does, charging each node its
/// approximate JSON size first.
struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        charge(5)?;
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        charge(20)?;
        Ok(Value::from(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        charge(20)?;
        Ok(Value::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        charge(24)?;
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        charge(v.len() + 2)?;
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        charge(v.len() + 2)?;
        Ok(Value::String(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        charge(4)?;
        Ok(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        self.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(ValueVisitor)
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(ValueVisitor)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        charge(2)?;
        let mut out = Vec::new();
        while let Some(Bounded(v)) = seq.next_element()? {
            charge(1)?;
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        charge(2)?;
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            charge(key.len() + 4)?;
            let Bounded(v) = map.next_value()?;
            // The last of repeated keys wins, as in `serde_json::Value` (the duplicate-field
            // check reports them separately).
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A nested-alias document: each level refers to the one before ten times.
    fn laughs(levels: usize) -> String {
        let mut doc = String::from("a0: &a0 [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n");
        for i in 1..=levels {
            let refs = vec![format!("*a{}", i - 1); 10].join(",");
            doc.push_str(&format!("a{i}: &a{i} [{refs}]\n"));
        }
        doc
    }

    #[test]
    fn plain_documents_decode_as_serde_json_values() {
        let text = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\ndata:\n  a: \"1\"\n  b: null\nn: 3\nf: 1.5\nt: true\nl: [1, two]\n";
        assert_eq!(
            decode(text).unwrap(),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"},
                   "data": {"a": "1", "b": null}, "n": 3, "f": 1.5, "t": true, "l": [1, "two"]})
        );
    }

    #[test]
    fn small_aliases_are_expanded() {
        let text = "a: &x {k: v}\nb: *x\nc: [*x, *x]\n";
        assert_eq!(
            decode(text).unwrap(),
            json!({"a": {"k": "v"}, "b": {"k": "v"}, "c": [{"k": "v"}, {"k": "v"}]})
        );
    }

    #[test]
    fn alias_bombs_stop_at_the_budget() {
        // Six levels name 10^7 strings (~60 MB of JSON) in well under a kilobyte.
        let text = laughs(6);
        assert!(text.len() < 1024, "{}", text.len());
        assert_eq!(decode(&text).unwrap_err(), EXCESSIVE_ALIASING);
        // The same shape within the budget decodes.
        let small = laughs(2);
        let v = decode_with_budget(&small, 16 * 1024).unwrap();
        assert_eq!(v["a2"].as_array().unwrap().len(), 10);
        assert_eq!(
            decode_with_budget(&small, 4096).unwrap_err(),
            EXCESSIVE_ALIASING
        );
    }

    #[test]
    fn errors_name_the_line_without_rust_hints() {
        let e = decode("a: b\nc: [\n").unwrap_err();
        assert!(e.starts_with("yaml: line "), "{e}");
        for hint in [
            "Option<",
            "from_str_multiple",
            "DuplicateKeyPolicy",
            "Options",
        ] {
            assert!(!e.contains(hint), "{e}");
        }
        let e = decode("a: 1\n---\nb: 2\n").unwrap_err();
        assert!(!e.contains("from_str_multiple"), "{e}");
    }
}
