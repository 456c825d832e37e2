//! Structural operations on objects, driven by the type graph's list semantics: the field set of
//! a value, merging an applied configuration into live state, removing owned fields, and the
//! fields an update changed.
//!
//! List semantics come from [`FieldRef::patch_strategy`]: a list with a merge key is an
//! associative list (items identified by the key, `k:` path elements), a merge list of scalars is
//! a set (`v:`), every other list is atomic (owned and replaced as a whole). Values the type graph
//! does not describe (custom resources, unknown fields, arbitrary JSON) are treated as objects
//! that merge property by property and atomic lists.

use serde_json::{Map, Value};
use setpoint_protobuf::types::{Elem, FieldRef, TypeRef};

use super::fieldset::{self, FieldSet};

/// What the schema says about a value.
#[derive(Clone, Copy, Debug)]
pub enum Shape {
    /// An object with typed properties.
    Type(TypeRef),
    /// An object with free keys whose values have the element type of `FieldRef`.
    Map(FieldRef),
    /// A list field.
    List(FieldRef),
    /// A scalar.
    Scalar,
    /// Anything the schema does not describe: objects merge by property, lists are atomic.
    Untyped,
}

impl Shape {
    /// The shape of property `key` of an object of this shape.
    fn property(self, key: &str) -> Shape {
        match self {
            Shape::Type(t) => match t.field(key) {
                Some(f) => of_field(f),
                None => Shape::Untyped,
            },
            Shape::Map(f) => of_elem(f.element()),
            _ => Shape::Untyped,
        }
    }

    /// The shape of one item of a list of this shape.
    fn item(self) -> Shape {
        match self {
            Shape::List(f) => of_elem(f.element()),
            _ => Shape::Untyped,
        }
    }
}

fn of_field(f: FieldRef) -> Shape {
    if f.is_list() {
        Shape::List(f)
    } else if f.is_map() {
        Shape::Map(f)
    } else {
        of_elem(f.element())
    }
}

fn of_elem(e: Elem) -> Shape {
    match e {
        Elem::Message(t) => Shape::Type(t),
        Elem::Scalar => Shape::Scalar,
        Elem::Json => Shape::Untyped,
    }
}

/// How a list's items are identified.
enum ListKind {
    /// Items are objects identified by the values of these properties (sorted by name, as
    /// Kubernetes writes them in `k:{...}` keys).
    Associative(Vec<&'static str>),
    /// Items are scalars identified by their value.
    Set,
    /// The list is one value.
    Atomic,
}

fn list_kind(shape: Shape) -> ListKind {
    match shape {
        Shape::List(f) => {
            let message = matches!(f.element(), Elem::Message(_));
            // The OpenAPI list type decides, as in Kubernetes' structured merge; the patch
            // strategy is the fallback for lists the OpenAPI leaves unmarked.
            match f.list_type() {
                Some(("map", keys)) if message && !keys.is_empty() => {
                    let mut keys = keys.to_vec();
                    keys.sort_unstable();
                    return ListKind::Associative(keys);
                }
                Some(("set", _)) if !message => return ListKind::Set,
                Some(("atomic", _)) => return ListKind::Atomic,
                _ => {}
            }
            let strategy = f.patch_strategy();
            match (strategy.merge_key(), strategy.merges_list(), message) {
                (Some(k), _, true) => ListKind::Associative(vec![k]),
                (None, true, false) => ListKind::Set,
                _ => ListKind::Atomic,
            }
        }
        _ => ListKind::Atomic,
    }
}

/// One step of a path through a value: a property, or a list index.
#[derive(Clone, Copy, Debug)]
pub enum PathStep<'a> {
    Key(&'a str),
    Index(usize),
}

/// The path elements (`f:`, `k:`, `v:`, `i:`) that name the value at `steps` of `value`, an
/// object of `shape`: list items by their keys or value where the list has them, else by index.
pub fn elements_at(shape: Shape, value: &Value, steps: &[PathStep<'_>]) -> Vec<String> {
    let mut out = Vec::with_capacity(steps.len());
    let mut shape = shape;
    let mut cur = Some(value);
    for step in steps {
        match *step {
            PathStep::Key(k) => {
                out.push(fieldset::field(k));
                shape = shape.property(k);
                cur = cur.and_then(|v| v.get(k));
            }
            PathStep::Index(i) => {
                let item = cur.and_then(|v| v.get(i));
                let element = item
                    .and_then(|it| item_element(&list_kind(shape), it))
                    .unwrap_or_else(|| fieldset::index(i));
                out.push(element);
                shape = shape.item();
                cur = item;
            }
        }
    }
    out
}

/// The value a missing key field of an associative item takes, when Kubernetes defaults it
/// (so an applied port without `protocol` is the same item as the stored one with `TCP`).
fn key_default(key: &str) -> Option<Value> {
    (key == "protocol").then(|| Value::String("TCP".into()))
}

/// The path element of an item of a list of `kind`, or `None` when it cannot be identified
/// (an associative item without its key).
fn item_element(kind: &ListKind, item: &Value) -> Option<String> {
    match kind {
        ListKind::Associative(ks) => {
            let mut keys = Map::new();
            for k in ks {
                match item.get(*k).cloned().or_else(|| key_default(k)) {
                    Some(v) => {
                        keys.insert((*k).to_string(), v);
                    }
                    // Only the first key is required to identify an item.
                    None if keys.is_empty() && k == &ks[0] => return None,
                    None => {}
                }
            }
            if keys.is_empty() {
                return None;
            }
            Some(fieldset::key(&keys))
        }
        ListKind::Set => Some(fieldset::value(item)),
        ListKind::Atomic => None,
    }
}

/// The set of every field `value` sets: scalars, atomic lists and empty objects are leaves,
/// associative and set items are members themselves, non-empty objects only lead to their
/// properties.
pub fn fields_of(value: &Value, shape: Shape) -> FieldSet {
    let mut set = FieldSet::new();
    add_fields(&mut set, value, shape);
    set
}

fn add_fields(node: &mut FieldSet, value: &Value, shape: Shape) {
    if let Value::Object(map) = value {
        for (k, v) in map {
            let child_shape = shape.property(k);
            let child = node.child_mut(&fieldset::field(k));
            add_value(child, v, child_shape);
        }
    }
}

/// Adds `value` as a member at `node` (its path already created by the caller) and its
/// children.
fn add_value(node: &mut FieldSet, value: &Value, shape: Shape) {
    match value {
        Value::Object(map) if !map.is_empty() && !matches!(shape, Shape::Scalar) => {
            add_fields(node, value, shape);
        }
        Value::Array(items) => match list_kind(shape) {
            ListKind::Atomic => mark(node),
            // An empty granular list has no items to own; the list itself is owned instead.
            _ if items.is_empty() => mark(node),
            kind => {
                for item in items {
                    match item_element(&kind, item) {
                        Some(elem) => {
                            let child = node.child_mut(&elem);
                            mark(child);
                            add_fields(child, item, shape.item());
                        }
                        // An item without identity makes the list impossible to track
                        // granularly; own it whole.
                        None => mark(node),
                    }
                }
            }
        },
        _ => mark(node),
    }
}

/// Makes `node` a member (an empty relative path inserts the node itself).
fn mark(node: &mut FieldSet) {
    node.set_member();
}

/// Merges applied configuration `config` into `live`: objects merge by property, associative
/// lists by key (live items keep their order, new items are appended), sets by value, and
/// everything else takes the configured value.
pub fn merge(live: &Value, config: &Value, shape: Shape) -> Value {
    match (live, config) {
        (Value::Object(l), Value::Object(c)) if !matches!(shape, Shape::Scalar) => {
            let mut out = l.clone();
            for (k, cv) in c {
                let merged = match l.get(k) {
                    Some(lv) => merge(lv, cv, shape.property(k)),
                    None => cv.clone(),
                };
                out.insert(k.clone(), merged);
            }
            Value::Object(out)
        }
        (Value::Array(l), Value::Array(c)) => {
            let kind = list_kind(shape);
            if matches!(kind, ListKind::Atomic) {
                return config.clone();
            }
            let mut out = l.clone();
            for citem in c {
                let Some(elem) = item_element(&kind, citem) else {
                    return config.clone();
                };
                match out
                    .iter()
                    .position(|li| item_element(&kind, li).as_deref() == Some(&elem))
                {
                    Some(i) => out[i] = merge(&out[i], citem, shape.item()),
                    None => out.push(citem.clone()),
                }
            }
            Value::Array(out)
        }
        _ => config.clone(),
    }
}

/// Removes from `obj` every member of `remove`, except members that `keep` still needs (a list
/// item or object some of whose fields `keep` owns is entered rather than removed). Objects
/// emptied by the removal are removed too, so defaulting can fill them in again.
pub fn remove(obj: &mut Value, remove: &FieldSet, keep: &FieldSet, shape: Shape) {
    let Value::Object(map) = obj else { return };
    for (elem, sub) in remove.children() {
        let Some(name) = elem.strip_prefix("f:") else {
            continue;
        };
        let child_shape = shape.property(name);
        let keep_sub = keep.child(elem);
        let Some(v) = map.get_mut(name) else { continue };
        let had_content = is_nonempty_container(v);
        if sub.is_member() && keep_sub.is_none_or(FieldSet::is_empty) {
            map.remove(name);
            continue;
        }
        remove_below(v, sub, keep_sub.unwrap_or(&FieldSet::new()), child_shape);
        if had_content && !is_nonempty_container(v) && keep_sub.is_none_or(FieldSet::is_empty) {
            map.remove(name);
        }
    }
}

fn is_nonempty_container(v: &Value) -> bool {
    match v {
        Value::Object(m) => !m.is_empty(),
        Value::Array(a) => !a.is_empty(),
        _ => false,
    }
}

fn remove_below(v: &mut Value, set: &FieldSet, keep: &FieldSet, shape: Shape) {
    match v {
        Value::Object(_) => remove(v, set, keep, shape),
        Value::Array(items) => {
            let kind = list_kind(shape);
            items.retain_mut(|item| {
                let Some(elem) = item_element(&kind, item) else {
                    return true;
                };
                let Some(sub) = set.child(&elem) else {
                    return true;
                };
                let keep_sub = keep.child(&elem);
                if sub.is_member() && keep_sub.is_none_or(FieldSet::is_empty) {
                    return false;
                }
                remove(
                    item,
                    sub,
                    keep_sub.unwrap_or(&FieldSet::new()),
                    shape.item(),
                );
                true
            });
        }
        _ => {}
    }
}

/// Removes `null` properties of objects, at any depth (list items included).
pub fn strip_nulls(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|_, x| !x.is_null());
            m.values_mut().for_each(strip_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

/// The value at `path` in `obj`, if present.
pub fn value_at<'a>(obj: &'a Value, path: &[String], shape: Shape) -> Option<&'a Value> {
    let Some((first, rest)) = path.split_first() else {
        return Some(obj);
    };
    let (kind, body) = first.split_once(':')?;
    match (kind, obj) {
        ("f", Value::Object(m)) => value_at(m.get(body)?, rest, shape.property(body)),
        ("k" | "v", Value::Array(items)) => {
            let lk = list_kind(shape);
            let item = items
                .iter()
                .find(|i| item_element(&lk, i).as_deref() == Some(first))?;
            value_at(item, rest, shape.item())
        }
        ("i", Value::Array(items)) => {
            value_at(items.get(body.parse::<usize>().ok()?)?, rest, shape.item())
        }
        _ => None,
    }
}

fn add_changed(node: &mut FieldSet, old: &Value, new: &Value, shape: Shape) {
    if let (Value::Object(o), Value::Object(n)) = (old, new) {
        changed_in(node, o, n, shape);
    }
}

/// An object's properties, as a parsed map or as borrowed [`Props`]: the two forms the
/// property walks below run over.
trait Properties {
    fn property(&self, key: &str) -> Option<&Value>;
    fn each(&self) -> impl Iterator<Item = (&str, &Value)>;
}

impl Properties for Map<String, Value> {
    fn property(&self, key: &str) -> Option<&Value> {
        self.get(key)
    }
    fn each(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.iter().map(|(k, v)| (k.as_str(), v))
    }
}

impl Properties for Props<'_> {
    fn property(&self, key: &str) -> Option<&Value> {
        self.0
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_ref())
    }
    fn each(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.0.iter().map(|(k, v)| (*k, v.as_ref()))
    }
}

/// Adds what changed in each property of `new` since `old`.
fn changed_in<P: Properties>(node: &mut FieldSet, old: &P, new: &P, shape: Shape) {
    for (k, nv) in new.each() {
        changed_property(node, k, old.property(k), nv, shape);
    }
}

/// The fields of `old`'s properties that `new` no longer has.
fn removed_in<P: Properties>(old: &P, new: &P, shape: Shape) -> FieldSet {
    let mut out = FieldSet::new();
    for (k, ov) in old.each() {
        if let Some(removed) = removed_property(k, ov, new.property(k), shape) {
            *out.child_mut(&fieldset::field(k)) = removed;
        }
    }
    out
}

/// Adds what changed in property `k` (of an object of `shape`) from `old` to `new`.
fn changed_property(node: &mut FieldSet, k: &str, old: Option<&Value>, new: &Value, shape: Shape) {
    let child_shape = shape.property(k);
    match old {
        None => add_value(node.child_mut(&fieldset::field(k)), new, child_shape),
        Some(ov) if ov == new => {}
        Some(ov) => {
            let child = node.child_mut(&fieldset::field(k));
            changed_value(child, ov, new, child_shape);
        }
    }
}

/// An object's top-level properties, borrowed where they are used unchanged: what
/// [`changed_props`] and [`removed_props`] compare without copying whole objects.
#[derive(Debug, Default)]
pub struct Props<'a>(Vec<(&'a str, std::borrow::Cow<'a, Value>)>);

impl<'a> Props<'a> {
    /// Adds a property.
    pub fn push(&mut self, key: &'a str, value: std::borrow::Cow<'a, Value>) {
        self.0.push((key, value));
    }

    /// The properties as an object of their own.
    pub fn into_value(self) -> Value {
        Value::Object(
            self.0
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.into_owned()))
                .collect(),
        )
    }
}

/// [`changed_fields`] of two objects given as [`Props`].
pub fn changed_props(old: &Props, new: &Props, shape: Shape) -> FieldSet {
    let mut set = FieldSet::new();
    changed_in(&mut set, old, new, shape);
    set
}

/// [`removed_fields`] of two objects given as [`Props`].
pub fn removed_props(old: &Props, new: &Props, shape: Shape) -> FieldSet {
    removed_in(old, new, shape)
}

fn changed_value(node: &mut FieldSet, old: &Value, new: &Value, shape: Shape) {
    match (old, new) {
        (Value::Object(om), Value::Object(nm))
            if !om.is_empty() && !nm.is_empty() && !matches!(shape, Shape::Scalar) =>
        {
            add_changed(node, old, new, shape)
        }
        (Value::Array(oi), Value::Array(ni)) => {
            let kind = list_kind(shape);
            if matches!(kind, ListKind::Atomic) {
                return mark(node);
            }
            for item in ni {
                let Some(elem) = item_element(&kind, item) else {
                    return mark(node);
                };
                let before = oi
                    .iter()
                    .find(|o| item_element(&kind, o).as_deref() == Some(&elem));
                match before {
                    Some(b) if b == item => {}
                    Some(b) => add_changed(node.child_mut(&elem), b, item, shape.item()),
                    None => {
                        let child = node.child_mut(&elem);
                        mark(child);
                        add_fields(child, item, shape.item());
                    }
                }
            }
        }
        _ => add_value(node, new, shape),
    }
}

/// The fields of property `k` (of an object of `shape`) that `old` had and `new` no longer
/// has, relative to the property; `None` if there are none.
fn removed_property(k: &str, old: &Value, new: Option<&Value>, shape: Shape) -> Option<FieldSet> {
    let child_shape = shape.property(k);
    let removed = match new {
        None => value_fields(old, child_shape),
        Some(nv) if nv == old => return None,
        Some(nv) => match (old, nv) {
            (Value::Object(om), Value::Object(nm))
                if !om.is_empty() && !nm.is_empty() && !matches!(child_shape, Shape::Scalar) =>
            {
                removed_in(om, nm, child_shape)
            }
            // Lists (and a value that changed type) are compared as whole field sets: their
            // items' identities decide what a field is, and they are small next to objects.
            _ => value_fields(old, child_shape).difference(&value_fields(nv, child_shape)),
        },
    };
    (!removed.is_empty()).then_some(removed)
}

/// The fields of a property's value, relative to the property (which is a member itself when
/// the value is a leaf).
fn value_fields(value: &Value, shape: Shape) -> FieldSet {
    let mut set = FieldSet::new();
    add_value(&mut set, value, shape);
    set
}

/// The fields an update from `old` to `new` set or changed (not the ones it removed); the
/// tests' reference for what the write path records.
#[cfg(test)]
fn changed_fields(old: &Value, new: &Value, shape: Shape) -> FieldSet {
    let mut set = FieldSet::new();
    add_changed(&mut set, old, new, shape);
    set
}

/// The fields `old` had that `new` no longer has: `fields_of(old)` minus `fields_of(new)`,
/// computed by walking both objects together and skipping equal values (the tests check it
/// against the difference of the two whole sets).
#[cfg(test)]
fn removed_fields(old: &Value, new: &Value, shape: Shape) -> FieldSet {
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => removed_in(o, n, shape),
        (Value::Object(_), _) => fields_of(old, shape),
        _ => FieldSet::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;
    use setpoint_protobuf::types;

    fn pod() -> Shape {
        Shape::Type(types::for_kind("", "v1", "Pod").unwrap())
    }

    /// Small pod-like objects: keyed lists (containers by name, ports, conditions by type, with
    /// duplicate keys now and then), a set (finalizers), maps, and values that change type.
    fn pod_like() -> impl Strategy<Value = Value> {
        let container = (
            prop::sample::select(vec!["a", "b"]),
            prop::option::of(prop::sample::select(vec!["i1", "i2"])),
            prop::option::of(prop::collection::vec(
                prop::sample::select(vec![80, 81]),
                0..3,
            )),
        )
            .prop_map(|(name, image, ports)| {
                let mut c = json!({ "name": name });
                if let Some(image) = image {
                    c["image"] = json!(image);
                }
                if let Some(ports) = ports {
                    let ports: Vec<Value> = ports
                        .into_iter()
                        .map(|p| json!({"containerPort": p, "protocol": "TCP"}))
                        .collect();
                    c["ports"] = Value::Array(ports);
                }
                c
            });
        let condition = (
            prop::sample::select(vec!["Ready", "PodScheduled"]),
            prop::sample::select(vec!["True", "False"]),
        )
            .prop_map(|(t, s)| json!({"type": t, "status": s}));
        let labels = prop::collection::btree_map(
            prop::sample::select(vec!["app", "tier"]),
            prop::sample::select(vec!["x", "y"]),
            0..3,
        );
        let odd = prop_oneof![
            Just(json!(null)),
            Just(json!({})),
            Just(json!([])),
            Just(json!("s")),
            Just(json!({"k": 1})),
            Just(json!([1, {"name": "a"}])),
        ];
        (
            prop::option::of(labels),
            prop::option::of(prop::collection::vec(
                prop::sample::select(vec!["f1", "f2"]),
                0..3,
            )),
            prop::option::of(prop::collection::vec(container, 0..3)),
            prop::option::of(prop::sample::select(vec!["n1", "n2"])),
            prop::option::of(prop::collection::vec(condition, 0..3)),
            prop::option::of(odd.clone()),
            prop::option::of(odd),
        )
            .prop_map(
                |(labels, finalizers, containers, node, conditions, odd1, odd2)| {
                    let mut o = json!({"metadata": {"name": "p"}, "spec": {}, "status": {}});
                    if let Some(l) = labels {
                        o["metadata"]["labels"] = json!(l);
                    }
                    if let Some(f) = finalizers {
                        o["metadata"]["finalizers"] = json!(f);
                    }
                    if let Some(c) = containers {
                        o["spec"]["containers"] = Value::Array(c);
                    }
                    if let Some(n) = node {
                        o["spec"]["nodeName"] = json!(n);
                    }
                    if let Some(c) = conditions {
                        o["status"]["conditions"] = Value::Array(c);
                    }
                    if let Some(v) = odd1 {
                        o["spec"]["tolerations"] = v;
                    }
                    if let Some(v) = odd2 {
                        o["status"]["podIP"] = v;
                    }
                    o
                },
            )
    }

    proptest! {
        /// The walk gives exactly the difference of the two whole field sets.
        #[test]
        fn removed_fields_is_the_difference_of_field_sets(old in pod_like(), new in pod_like()) {
            for shape in [pod(), Shape::Untyped] {
                let whole = fields_of(&old, shape).difference(&fields_of(&new, shape));
                prop_assert_eq!(removed_fields(&old, &new, shape), whole);
            }
        }
    }

    fn deployment() -> Shape {
        Shape::Type(types::for_kind("apps", "v1", "Deployment").unwrap())
    }

    #[test]
    fn field_set_follows_list_semantics() {
        let v = json!({
            "metadata": {"labels": {"app": "x"}, "finalizers": ["a"]},
            "spec": {
                "replicas": 3,
                "selector": {"matchLabels": {}},
                "template": {"spec": {
                    "containers": [{"name": "main", "image": "i", "args": ["a", "b"]}],
                    "tolerations": [{"key": "k"}]
                }}
            }
        });
        let set = fields_of(&v, deployment());
        assert_eq!(
            set.to_json(),
            json!({
                "f:metadata": {"f:labels": {"f:app": {}}, "f:finalizers": {"v:\"a\"": {}}},
                "f:spec": {
                    "f:replicas": {},
                    "f:selector": {"f:matchLabels": {}},
                    "f:template": {"f:spec": {
                        "f:containers": {"k:{\"name\":\"main\"}": {
                            ".": {}, "f:args": {}, "f:image": {}, "f:name": {}
                        }},
                        "f:tolerations": {}
                    }}
                }
            })
        );
    }

    #[test]
    fn merge_by_key_set_and_atomic() {
        let live = json!({"spec": {"replicas": 1, "paused": true, "template": {"spec": {
            "containers": [{"name": "a", "image": "1", "ports": [{"containerPort": 80}]},
                           {"name": "b", "image": "2"}],
            "tolerations": [{"key": "x"}]
        }}}, "metadata": {"finalizers": ["f1"]}});
        let config = json!({"spec": {"replicas": 3, "template": {"spec": {
            "containers": [{"name": "c", "image": "3"}, {"name": "a", "image": "9"}],
            "tolerations": [{"key": "y"}]
        }}}, "metadata": {"finalizers": ["f2", "f1"]}});
        let out = merge(&live, &config, deployment());
        assert_eq!(
            out,
            json!({"spec": {"replicas": 3, "paused": true, "template": {"spec": {
                "containers": [{"name": "a", "image": "9", "ports": [{"containerPort": 80}]},
                               {"name": "b", "image": "2"}, {"name": "c", "image": "3"}],
                "tolerations": [{"key": "y"}]
            }}}, "metadata": {"finalizers": ["f1", "f2"]}})
        );
    }

    #[test]
    fn untyped_lists_are_atomic() {
        let out = merge(
            &json!({"spec": {"items": [{"name": "a", "x": 1}], "keep": 1}}),
            &json!({"spec": {"items": [{"name": "a"}]}}),
            Shape::Untyped,
        );
        assert_eq!(out, json!({"spec": {"items": [{"name": "a"}], "keep": 1}}));
    }

    #[test]
    fn removal_spares_what_others_own() {
        let mut obj = json!({"spec": {
            "replicas": 3,
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}},
            "template": {"spec": {"containers": [
                {"name": "a", "image": "1", "ports": [{"containerPort": 80}, {"containerPort": 81}]},
                {"name": "b", "image": "2"}
            ]}}
        }});
        let full = fields_of(&obj, deployment());
        let owned_by_other = fields_of(
            &json!({"spec": {"template": {"spec": {"containers": [{"name": "b", "image": "2"}]}}}}),
            deployment(),
        );
        let still_applied = fields_of(
            &json!({"spec": {"replicas": 3, "template": {"spec": {"containers": [
                {"name": "a", "image": "1", "ports": [{"containerPort": 80}]}
            ]}}}}),
            deployment(),
        );
        let gone = full.difference(&still_applied).difference(&owned_by_other);
        remove(&mut obj, &gone, &owned_by_other, deployment());
        assert_eq!(
            obj,
            json!({"spec": {"replicas": 3, "template": {"spec": {"containers": [
                {"name": "a", "image": "1", "ports": [{"containerPort": 80}]},
                {"name": "b", "image": "2"}
            ]}}}})
        );
    }

    #[test]
    fn changed_fields_are_what_an_update_set() {
        let old = json!({"spec": {"replicas": 1, "template": {"spec": {"containers": [
            {"name": "a", "image": "1"}]}}}});
        let new = json!({"spec": {"replicas": 2, "paused": true, "template": {"spec": {
            "containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "2"}]}}}});
        assert_eq!(
            changed_fields(&old, &new, deployment()).to_json(),
            json!({"f:spec": {"f:replicas": {}, "f:paused": {}, "f:template": {"f:spec": {
                "f:containers": {"k:{\"name\":\"b\"}": {".": {}, "f:image": {}, "f:name": {}}}}}}})
        );
        assert_eq!(
            removed_fields(&new, &old, deployment()).to_json(),
            json!({"f:spec": {"f:paused": {}, "f:template": {"f:spec": {
                "f:containers": {"k:{\"name\":\"b\"}": {".": {}, "f:image": {}, "f:name": {}}}}}}})
        );
    }

    #[test]
    fn value_at_resolves_keys() {
        let v =
            json!({"spec": {"template": {"spec": {"containers": [{"name": "a", "image": "1"}]}}}});
        let path: Vec<String> = [
            "f:spec",
            "f:template",
            "f:spec",
            "f:containers",
            "k:{\"name\":\"a\"}",
            "f:image",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(value_at(&v, &path, deployment()), Some(&json!("1")));
    }
}
