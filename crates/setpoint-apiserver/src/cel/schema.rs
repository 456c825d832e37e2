//! Reading OpenAPI v3 schemas as the cost estimator and the type checker need them: a
//! node's properties, items and map values, with `$ref`s (and a lone `allOf` around one,
//! as built-in kinds' documents write them) resolved against the document's
//! `components.schemas`.

use serde_json::Value;

/// A schema node and the named schemas its `$ref`s point into.
#[derive(Clone, Copy, Debug)]
pub struct Node<'a> {
    /// The node itself.
    pub schema: &'a Value,
    /// `components.schemas` of the document the node comes from, if it has references.
    pub definitions: Option<&'a Value>,
}

/// How deep `$ref`s are followed from one node (a cycle would otherwise loop).
const MAX_REF_DEPTH: usize = 16;

impl<'a> Node<'a> {
    /// A node without references (a CRD's structural schema).
    pub fn new(schema: &'a Value) -> Node<'a> {
        Node {
            schema,
            definitions: None,
        }
    }

    /// A node of an OpenAPI document whose `$ref`s name `definitions`' entries.
    pub fn with_definitions(schema: &'a Value, definitions: &'a Value) -> Node<'a> {
        Node {
            schema,
            definitions: Some(definitions),
        }
    }

    fn at(&self, schema: &'a Value) -> Node<'a> {
        Node {
            schema,
            definitions: self.definitions,
        }
        .resolved()
    }

    /// The node its `$ref` (or a lone `allOf` entry) points at; itself without one.
    pub fn resolved(self) -> Node<'a> {
        let mut node = self;
        for _ in 0..MAX_REF_DEPTH {
            let s = node.schema;
            if let Some(r) = s.get("$ref").and_then(Value::as_str) {
                let name = r.rsplit('/').next().unwrap_or(r);
                match self.definitions.and_then(|d| d.get(name)) {
                    Some(target) => node.schema = target,
                    None => return node,
                }
            } else if let Some([only]) = s.get("allOf").and_then(Value::as_array).map(Vec::as_slice)
            {
                if s.get("properties").is_some() || s.get("type").is_some() {
                    return node;
                }
                node.schema = only;
            } else {
                return node;
            }
        }
        node
    }

    /// The declared `type`, if any.
    pub fn type_name(&self) -> Option<&'a str> {
        self.schema.get("type").and_then(Value::as_str)
    }

    /// Whether the node accepts fields it does not declare (no fixed set of properties to
    /// check a reference against).
    pub fn open(&self) -> bool {
        let s = self.schema;
        s.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
            || s.get("x-kubernetes-embedded-resource") == Some(&Value::Bool(true))
            || s.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true))
            || s.get("additionalProperties")
                .is_some_and(|a| a != &Value::Bool(false))
            || s.get("properties").is_none()
    }

    /// The schema of property `name`, or of a map's values.
    pub fn field(&self, name: &str) -> Option<Node<'a>> {
        let s = self.schema;
        if let Some(p) = s.get("properties").and_then(|p| p.get(name)) {
            return Some(self.at(p));
        }
        match s.get("additionalProperties") {
            Some(a) if a.is_object() => Some(self.at(a)),
            _ => None,
        }
    }

    /// The schema of a list's items or a map's values.
    pub fn element(&self) -> Option<Node<'a>> {
        let s = self.schema;
        if let Some(items) = s.get("items").filter(|i| i.is_object()) {
            return Some(self.at(items));
        }
        match s.get("additionalProperties") {
            Some(a) if a.is_object() => Some(self.at(a)),
            _ => None,
        }
    }

    /// Whether the node is a map (an object of arbitrary keys).
    pub fn is_map(&self) -> bool {
        self.schema
            .get("additionalProperties")
            .is_some_and(Value::is_object)
    }

    /// A declared bound: `maxItems`, `maxLength` or `maxProperties`.
    pub fn bound(&self, key: &str) -> Option<u64> {
        self.schema.get(key).and_then(Value::as_u64)
    }
}
