//! Strategic merge patch (`application/strategic-merge-patch+json`) for built-in kinds.
//!
//! A strategic merge patch is a JSON merge patch whose lists can merge item by item. How each
//! field merges comes from the type graph and patch metadata in `setpoint_protobuf`
//! ([`TypeRef`], [`setpoint_protobuf::types::FieldRef::patch_strategy`]), the same table the
//! OpenAPI output is meant to read, so there are no per-field special cases here.
//!
//! # Semantics (what kubectl and client-go expect of a Kubernetes API server)
//! - Objects merge recursively; a `null` value removes the key. Maps (`labels`, `annotations`,
//!   `nodeSelector`, `resources.limits`) merge key by key. Properties the type does not know, and
//!   arbitrary JSON (`RawExtension`), merge like plain JSON.
//! - Lists without a merge strategy (`tolerations`, `args`, `command`, `envFrom`, …) and every
//!   list the type does not describe are replaced whole.
//! - Lists with `patchStrategy: merge` and a merge key (`containers` by `name`, `ports` by
//!   `containerPort`, `conditions` by `type`, …) merge item by item: an item whose key matches a
//!   stored item is merged into it recursively, other items are added. An item
//!   `{"<key>": v, "$patch": "delete"}` removes the stored items with that key; an item
//!   `{"$patch": "replace"}` makes the list exactly the patch's other items; `{"$patch":
//!   "merge"}` asks for the default and changes nothing.
//! - Merge lists of scalars (`finalizers`, `podCIDRs`) are ordered sets: the patch's values are
//!   added once each; `"$deleteFromPrimitiveList/<field>": [v, …]` removes values (from any list
//!   of scalars).
//! - Order: `"$setElementOrder/<field>": [...]` (merge-key objects, or the values of a list of
//!   scalars) fixes the order of the items it names. Without it the patch list's own order
//!   does. Stored items the order does not name keep their relative order and are interleaved by
//!   their stored position, before the first named item that the stored list had after them.
//!   Items new to the list are not in the stored order, so in a patch without
//!   `$setElementOrder` they come before the stored items that follow them, exactly as in
//!   Kubernetes (whose own docs show a container added by `kubectl patch` landing first).
//!   `$setElementOrder` may name items that do not exist (ignored); the patch list's items must
//!   appear in it in the same relative order.
//! - `"$retainKeys": [..]` in an object clears every stored property it does not list; every
//!   property the same patch object sets must be listed. kubectl sends it for fields with the
//!   `retainKeys` strategy (`Deployment.spec.strategy`, items of `volumes`) to switch between
//!   union members; like Kubernetes, it is honoured wherever it appears.
//! - `"$patch": "replace"` in an object replaces the object with the rest of the patch object;
//!   `"$patch": "delete"` removes it (at the top level it empties the object).
//! - Fields with `patchStrategy: replace` (`PodDisruptionBudgetSpec.selector`) are replaced
//!   whole, objects included.
//! - A patch value for a key the original lacks is applied to nothing: directives and `null`s
//!   in it are resolved rather than stored.
//!
//! Malformed patches (unknown `$` directives, a directive with the wrong JSON type, a merge-list
//! item without its merge key, `$retainKeys` missing a patched property, an order that
//! contradicts the patch list) are 400 BadRequest. A patch that cannot be applied to the stored
//! object (a stored merge-list item that is not an object) is 422 Invalid.
//!
//! [`create_two_way`] computes the patch that turns one object into another, in the form
//! kubectl sends (deletions as `null`, `$patch: delete` and `$deleteFromPrimitiveList`, plus
//! `$setElementOrder` and `$retainKeys`).

use std::fmt::Display;

use serde_json::{Map, Value};
use setpoint_api::ApiError;
use setpoint_protobuf::types::{Elem, FieldRef, PatchStrategy, TypeRef};

/// `$patch: replace | delete | merge`, in an object or as a list item.
const PATCH: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const DELETE_FROM_PRIMITIVE_LIST: &str = "$deleteFromPrimitiveList/";
const SET_ELEMENT_ORDER: &str = "$setElementOrder/";

/// Applies strategic merge patch `patch` to `original`, an object of type `ty`.
pub fn apply(original: &Value, patch: &Value, ty: TypeRef) -> Result<Value, ApiError> {
    let Value::Object(patch) = patch else {
        return Err(ApiError::bad_request(
            "a strategic merge patch must be a JSON object",
        ));
    };
    let base = original.as_object().cloned();
    let merged = merge_object(base, patch, Shape::Object(ty), "")?;
    Ok(Value::Object(merged.unwrap_or_default()))
}

/// The two-way strategic merge patch that turns `original` into `modified` (both objects of type
/// `ty`; anything else counts as an empty object), computed as kubectl computes it: added and
/// changed values as they are in `modified`, removed properties as `null`, removed merge-list
/// items as `{"<key>": …, "$patch": "delete"}`, removed set values under
/// `$deleteFromPrimitiveList/<field>`, `$setElementOrder/<field>` whenever a merge list changed
/// or was reordered, and `$retainKeys` in changed objects of `retainKeys` fields.
///
/// A merge list that cannot be matched by key (an item without its key, or two items with the
/// same one) is sent whole with a `{"$patch": "replace"}` item. Merge lists of scalars are sets:
/// duplicates in `modified` cannot be expressed and collapse.
pub fn create_two_way(original: &Value, modified: &Value, ty: TypeRef) -> Value {
    let empty = Map::new();
    let a = original.as_object().unwrap_or(&empty);
    let b = modified.as_object().unwrap_or(&empty);
    Value::Object(diff_object(a, b, Shape::Object(ty), false))
}

// ---------------------------------------------------------------------------------------------
// What the schema says about a value

/// How a value is interpreted when it is an object.
#[derive(Clone, Copy, Debug)]
enum Shape {
    /// A message: properties are looked up in the type graph.
    Object(TypeRef),
    /// `map<string, T>`: free keys, each value of the element type.
    Map(Elem),
    /// JSON the schema does not describe: merges like a JSON merge patch.
    Any,
    /// A scalar field.
    Scalar,
}

impl Shape {
    fn of(elem: Elem) -> Shape {
        match elem {
            Elem::Message(t) => Shape::Object(t),
            Elem::Scalar => Shape::Scalar,
            Elem::Json => Shape::Any,
        }
    }

    /// The spec of property `key` of a value of this shape.
    fn child(self, key: &str) -> Spec {
        match self {
            Shape::Object(t) => t.field(key).map(Spec::of_field).unwrap_or(Spec::UNTYPED),
            Shape::Map(elem) => Spec {
                value: Shape::of(elem),
                ..Spec::UNTYPED
            },
            Shape::Any | Shape::Scalar => Spec::UNTYPED,
        }
    }

    /// The shape used when the value at hand is an object: an object where the schema expects a
    /// scalar is not something the schema describes, so it merges like plain JSON (which keeps
    /// strategic merge patch identical to a JSON merge patch wherever no strategy applies).
    fn for_object(self) -> Shape {
        match self {
            Shape::Scalar => Shape::Any,
            other => other,
        }
    }
}

/// How a list is patched.
#[derive(Clone, Copy, Debug)]
enum ListKind {
    /// Replaced whole.
    Atomic,
    /// Items matched on `key` and merged as `item`.
    Keyed { key: &'static str, item: Shape },
    /// An ordered set of scalars.
    Set,
}

/// Everything the merge needs to know about one property.
#[derive(Clone, Copy, Debug)]
struct Spec {
    /// How the value merges when it is an object.
    value: Shape,
    /// How the value merges when it is a list.
    list: ListKind,
    /// `patchStrategy: replace`: objects are replaced, not merged.
    replace: bool,
    /// `retainKeys` (the object, or each item of the list): used when computing patches.
    retain_keys: bool,
}

impl Spec {
    const UNTYPED: Spec = Spec {
        value: Shape::Any,
        list: ListKind::Atomic,
        replace: false,
        retain_keys: false,
    };

    fn of_field(f: FieldRef) -> Spec {
        let strategy = f.patch_strategy();
        if f.is_map() {
            return Spec {
                value: Shape::Map(f.element()),
                ..Spec::UNTYPED
            };
        }
        let retain_keys = strategy.retains_keys();
        if f.is_list() {
            let list = match (strategy.merges_list(), strategy.merge_key()) {
                (true, Some(key)) => ListKind::Keyed {
                    key,
                    item: Shape::of(f.element()),
                },
                (true, None) => ListKind::Set,
                (false, _) => ListKind::Atomic,
            };
            return Spec {
                list,
                retain_keys,
                ..Spec::UNTYPED
            };
        }
        Spec {
            value: Shape::of(f.element()),
            list: ListKind::Atomic,
            replace: strategy == PatchStrategy::Replace,
            retain_keys,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Errors and paths

fn at(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!(" at {path}")
    }
}

/// A malformed patch: 400, as Kubernetes answers for bad strategic merge patch formats.
fn bad(path: &str, message: impl Display) -> ApiError {
    ApiError::bad_request(format!(
        "invalid strategic merge patch{}: {message}",
        at(path)
    ))
}

/// A well-formed patch that cannot be applied to the stored object: 422.
fn unprocessable(path: &str, message: impl Display) -> ApiError {
    ApiError::new(
        422,
        "Invalid",
        format!(
            "the strategic merge patch cannot be applied{}: {message}",
            at(path)
        ),
    )
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn item_path(path: &str, key: &str, value: &Value) -> String {
    match value {
        Value::String(s) => format!("{path}[{key}={s}]"),
        other => format!("{path}[{key}={other}]"),
    }
}

// ---------------------------------------------------------------------------------------------
// Applying a patch

/// Equality of JSON values where numbers compare by value (`80` and `80.0` are one port).
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(x), Some(y)) => x == y,
            _ => x.as_f64() == y.as_f64(),
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| json_eq(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

fn is_scalar(v: &Value) -> bool {
    !v.is_object() && !v.is_array()
}

/// The identity of an item of a list of scalars (or of a list ordered by whole values).
fn itself(v: &Value) -> Option<&Value> {
    Some(v)
}

fn key_matches(item: &Value, key: &str, wanted: &Value) -> bool {
    item.get(key).is_some_and(|v| json_eq(v, wanted))
}

/// Merges patch object `patch` into `base` (absent: nothing). `None` means the object is to be
/// removed (`$patch: delete`).
fn merge_object(
    base: Option<Map<String, Value>>,
    patch: &Map<String, Value>,
    shape: Shape,
    path: &str,
) -> Result<Option<Map<String, Value>>, ApiError> {
    if let Some(directive) = patch.get(PATCH) {
        match directive.as_str() {
            Some("delete") => return Ok(None),
            Some("replace") => {
                let mut rest = patch.clone();
                rest.remove(PATCH);
                return merge_object(None, &rest, shape, path);
            }
            Some("merge") => {}
            _ => {
                return Err(bad(
                    path,
                    format!("unknown $patch directive {directive}; expected \"replace\", \"delete\" or \"merge\""),
                ))
            }
        }
    }

    // Sort the patch's keys first: the result must not depend on the order keys were sent in.
    let mut retain = None;
    let mut orders: Vec<(&str, &[Value])> = Vec::new();
    let mut deletions: Vec<(&str, &[Value])> = Vec::new();
    let mut fields: Vec<(&str, &Value)> = Vec::new();
    for (k, v) in patch {
        if k == PATCH {
            continue;
        }
        if k == RETAIN_KEYS {
            retain = Some(v);
        } else if let Some(field) = k.strip_prefix(SET_ELEMENT_ORDER) {
            orders.push((field, directive_list(k, field, v, path)?));
        } else if let Some(field) = k.strip_prefix(DELETE_FROM_PRIMITIVE_LIST) {
            deletions.push((field, directive_list(k, field, v, path)?));
        } else if k.starts_with('$') {
            return Err(bad(
                path,
                format!("unknown directive {k:?}; the directives are $patch, $retainKeys, $setElementOrder/<field> and $deleteFromPrimitiveList/<field>"),
            ));
        } else {
            fields.push((k, v));
        }
    }

    let mut out = base.unwrap_or_default();
    if let Some(retain) = retain {
        apply_retain_keys(&mut out, retain, &fields, path)?;
    }
    for &(k, v) in &fields {
        if v.is_null() {
            out.remove(k);
            continue;
        }
        let spec = shape.child(k);
        let order = orders.iter().find(|(f, _)| *f == k).map(|(_, o)| *o);
        match merge_value(out.get(k), v, spec, order, &join(path, k))? {
            Some(merged) => {
                out.insert(k.to_string(), merged);
            }
            None => {
                out.remove(k);
            }
        }
    }
    // An order for a list the patch does not otherwise touch reorders the stored list.
    for &(field, order) in &orders {
        if fields.iter().any(|(k, _)| *k == field) {
            continue;
        }
        let Some(Value::Array(items)) = out.get(field) else {
            continue;
        };
        let fpath = join(path, field);
        let reordered = match shape.child(field).list {
            ListKind::Keyed { key, .. } => {
                let wanted = order_keys(order, key, &fpath)?;
                order_items(items.clone(), &wanted, |v| v.get(key), items)
            }
            ListKind::Set | ListKind::Atomic => {
                let wanted: Vec<&Value> = order.iter().collect();
                order_items(items.clone(), &wanted, itself, items)
            }
        };
        out.insert(field.to_string(), Value::Array(reordered));
    }
    for &(field, values) in &deletions {
        let fpath = join(path, field);
        if !values.iter().all(is_scalar) {
            return Err(bad(
                &fpath,
                "$deleteFromPrimitiveList lists values of a list of scalars",
            ));
        }
        match out.get_mut(field) {
            None | Some(Value::Null) => {}
            Some(Value::Array(items)) => {
                items.retain(|item| !values.iter().any(|v| json_eq(item, v)));
            }
            Some(_) => {
                return Err(unprocessable(
                    &fpath,
                    "$deleteFromPrimitiveList applies to a list, and the stored value is not one",
                ))
            }
        }
    }
    Ok(Some(out))
}

/// The JSON list a `$setElementOrder/<field>` or `$deleteFromPrimitiveList/<field>` directive
/// must carry.
fn directive_list<'a>(
    key: &str,
    field: &str,
    value: &'a Value,
    path: &str,
) -> Result<&'a [Value], ApiError> {
    if field.is_empty() || field.starts_with('$') {
        return Err(bad(
            path,
            format!("directive {key:?} does not name a field"),
        ));
    }
    match value {
        Value::Array(items) => Ok(items),
        _ => Err(bad(path, format!("{key} must be a list"))),
    }
}

/// `$retainKeys`: every property the patch sets must be listed; stored properties that are not
/// listed are cleared.
fn apply_retain_keys(
    out: &mut Map<String, Value>,
    retain: &Value,
    fields: &[(&str, &Value)],
    path: &str,
) -> Result<(), ApiError> {
    let Value::Array(list) = retain else {
        return Err(bad(path, "$retainKeys must be a list of property names"));
    };
    let mut keep: Vec<&str> = Vec::with_capacity(list.len());
    for v in list {
        match v.as_str() {
            Some(s) => keep.push(s),
            None => return Err(bad(path, "$retainKeys must be a list of property names")),
        }
    }
    if let Some((k, _)) = fields
        .iter()
        .find(|(k, v)| !v.is_null() && !keep.contains(k))
    {
        return Err(bad(
            path,
            format!("the patch sets {k:?}, which $retainKeys does not list"),
        ));
    }
    out.retain(|k, _| keep.contains(&k.as_str()));
    Ok(())
}

/// Merges one patch value into the stored value of a property. `None` removes the property.
fn merge_value(
    stored: Option<&Value>,
    patch: &Value,
    spec: Spec,
    order: Option<&[Value]>,
    path: &str,
) -> Result<Option<Value>, ApiError> {
    match patch {
        Value::Object(p) => {
            let base = if spec.replace {
                None
            } else {
                stored.and_then(Value::as_object).cloned()
            };
            Ok(merge_object(base, p, spec.value.for_object(), path)?.map(Value::Object))
        }
        Value::Array(items) => {
            let stored = stored.and_then(Value::as_array).map(Vec::as_slice);
            let merged = match spec.list {
                ListKind::Atomic => match order {
                    // Kubernetes orders even a replaced list when told to.
                    Some(order) => {
                        let wanted: Vec<&Value> = order.iter().collect();
                        order_items(items.clone(), &wanted, itself, items)
                    }
                    None => items.clone(),
                },
                ListKind::Keyed { key, item } => {
                    merge_keyed_list(stored.unwrap_or(&[]), items, key, item, order, path)?
                }
                ListKind::Set => merge_set(stored.unwrap_or(&[]), items, order, path)?,
            };
            Ok(Some(Value::Array(merged)))
        }
        scalar => Ok(Some(scalar.clone())),
    }
}

/// A merge list of objects matched on `key`.
fn merge_keyed_list(
    stored: &[Value],
    patch: &[Value],
    key: &str,
    item: Shape,
    order: Option<&[Value]>,
    path: &str,
) -> Result<Vec<Value>, ApiError> {
    if stored.iter().any(|s| !s.is_object()) {
        return Err(unprocessable(
            path,
            format!("the stored list has an item that is not an object, so it cannot be merged by {key:?}"),
        ));
    }
    let mut merged = stored.to_vec();
    let mut replace = false;
    let mut entries: Vec<&Map<String, Value>> = Vec::new();
    for p in patch {
        let Value::Object(obj) = p else {
            return Err(bad(
                path,
                format!("the items of this list must be objects with the merge key {key:?}"),
            ));
        };
        let Some(directive) = obj.get(PATCH) else {
            entries.push(obj);
            continue;
        };
        match directive.as_str() {
            Some("delete") => {
                let Some(value) = obj.get(key) else {
                    return Err(bad(
                        path,
                        format!("a {{\"$patch\": \"delete\"}} item must carry the merge key {key:?}"),
                    ));
                };
                merged.retain(|stored| !key_matches(stored, key, value));
            }
            Some("replace") => replace = true,
            Some("merge") => {}
            _ => {
                return Err(bad(
                    path,
                    format!("unknown $patch directive {directive} in a list item; expected \"replace\", \"delete\" or \"merge\""),
                ))
            }
        }
    }

    if replace {
        // The list becomes the patch's other items, in their order.
        let mut out = Vec::with_capacity(entries.len());
        for obj in entries {
            let ipath = match obj.get(key) {
                Some(v) => item_path(path, key, v),
                None => format!("{path}[]"),
            };
            if let Some(m) = merge_object(None, obj, item.for_object(), &ipath)? {
                out.push(Value::Object(m));
            }
        }
        return Ok(out);
    }

    let mut named: Vec<&Value> = Vec::with_capacity(entries.len());
    for obj in &entries {
        let Some(value) = obj.get(key) else {
            return Err(bad(
                path,
                format!("every item of this list must carry the merge key {key:?}"),
            ));
        };
        named.push(value);
        let ipath = item_path(path, key, value);
        match merged.iter().position(|s| key_matches(s, key, value)) {
            Some(pos) => {
                let base = merged[pos].as_object().cloned();
                let m = merge_object(base, obj, item.for_object(), &ipath)?;
                merged[pos] = Value::Object(m.unwrap_or_default());
            }
            None => {
                if let Some(m) = merge_object(None, obj, item.for_object(), &ipath)? {
                    merged.push(Value::Object(m));
                }
            }
        }
    }

    let wanted = match order {
        Some(order) => {
            let wanted = order_keys(order, key, path)?;
            check_order(&named, &wanted, path)?;
            wanted
        }
        None => named,
    };
    Ok(order_items(merged, &wanted, |v| v.get(key), stored))
}

/// A merge list of scalars: an ordered set.
fn merge_set(
    stored: &[Value],
    patch: &[Value],
    order: Option<&[Value]>,
    path: &str,
) -> Result<Vec<Value>, ApiError> {
    if !patch.iter().all(is_scalar) {
        return Err(bad(
            path,
            "this list is a set of scalars: its items must be strings, numbers or booleans",
        ));
    }
    let mut merged: Vec<Value> = Vec::with_capacity(stored.len() + patch.len());
    for v in stored.iter().chain(patch) {
        if !merged.iter().any(|m| json_eq(m, v)) {
            merged.push(v.clone());
        }
    }
    let named: Vec<&Value> = patch.iter().collect();
    let wanted = match order {
        Some(order) => {
            let wanted: Vec<&Value> = order.iter().collect();
            check_order(&named, &wanted, path)?;
            wanted
        }
        None => named,
    };
    Ok(order_items(merged, &wanted, itself, stored))
}

/// The merge-key values a `$setElementOrder` list of objects names.
fn order_keys<'a>(order: &'a [Value], key: &str, path: &str) -> Result<Vec<&'a Value>, ApiError> {
    order
        .iter()
        .map(|o| {
            o.get(key).ok_or_else(|| {
                bad(
                    path,
                    format!(
                        "every $setElementOrder item must be an object with the merge key {key:?}"
                    ),
                )
            })
        })
        .collect()
}

/// The patch list's items must appear in `$setElementOrder`, in the same relative order.
fn check_order(named: &[&Value], order: &[&Value], path: &str) -> Result<(), ApiError> {
    if named.is_empty() || order.is_empty() {
        return Ok(());
    }
    let mut rest = order.iter();
    for n in named {
        if !rest.any(|o| json_eq(o, n)) {
            return Err(bad(
                path,
                "the items of the patch list are missing from $setElementOrder or in a different order",
            ));
        }
    }
    Ok(())
}

/// Orders `merged`: items whose identity is in `wanted` follow that order; the others keep the
/// order they had in `stored`, and each goes before the first wanted item that `stored` had after
/// it (items new to the list cannot be compared and stay after the wanted item at hand).
fn order_items<'v>(
    merged: Vec<Value>,
    wanted: &[&Value],
    id: impl Fn(&Value) -> Option<&Value>,
    stored: &'v [Value],
) -> Vec<Value> {
    let stored_ids: Vec<Option<&'v Value>> = stored.iter().map(&id).collect();
    let stored_pos = |v: &Value| -> Option<usize> {
        let i = id(v)?;
        stored_ids
            .iter()
            .position(|s| s.is_some_and(|s| json_eq(s, i)))
    };
    let wanted_pos = |v: &Value| -> Option<usize> {
        let i = id(v)?;
        wanted.iter().position(|w| json_eq(w, i))
    };
    let mut named: Vec<(usize, Option<usize>, Value)> = Vec::new();
    let mut others: Vec<(usize, Option<usize>, Value)> = Vec::new();
    for v in merged {
        let s = stored_pos(&v);
        match wanted_pos(&v) {
            Some(w) => named.push((w, s, v)),
            None => others.push((s.unwrap_or(usize::MAX), s, v)),
        }
    }
    // Stable sorts: equal ranks keep their merged order.
    named.sort_by_key(|(rank, _, _)| *rank);
    others.sort_by_key(|(rank, _, _)| *rank);

    let mut out = Vec::with_capacity(named.len() + others.len());
    let mut named = named.into_iter().peekable();
    let mut others = others.into_iter().peekable();
    loop {
        let take_other = match (others.peek(), named.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some((_, so, _)), Some((_, sn, _))) => matches!((so, sn), (Some(a), Some(b)) if a < b),
        };
        let next = if take_other {
            others.next()
        } else {
            named.next()
        };
        if let Some((_, _, v)) = next {
            out.push(v);
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Computing a patch

fn diff_object(
    a: &Map<String, Value>,
    b: &Map<String, Value>,
    shape: Shape,
    retain_keys: bool,
) -> Map<String, Value> {
    let mut patch = Map::new();
    for (k, bv) in b {
        let Some(av) = a.get(k) else {
            patch.insert(k.clone(), bv.clone());
            continue;
        };
        let spec = shape.child(k);
        match (av, bv) {
            (Value::Object(ao), Value::Object(bo)) => {
                if spec.replace {
                    if !json_eq(av, bv) {
                        patch.insert(k.clone(), bv.clone());
                    }
                } else {
                    let d = diff_object(ao, bo, spec.value.for_object(), spec.retain_keys);
                    if !d.is_empty() {
                        patch.insert(k.clone(), Value::Object(d));
                    }
                }
            }
            (Value::Array(al), Value::Array(bl)) => match spec.list {
                ListKind::Atomic => {
                    if !json_eq(av, bv) {
                        patch.insert(k.clone(), bv.clone());
                    }
                }
                ListKind::Keyed { key, item } => {
                    diff_keyed_list(&mut patch, k, al, bl, key, item, spec.retain_keys)
                }
                ListKind::Set => diff_set(&mut patch, k, al, bl),
            },
            _ => {
                if !json_eq(av, bv) {
                    patch.insert(k.clone(), bv.clone());
                }
            }
        }
    }
    for k in a.keys() {
        if !b.contains_key(k) {
            patch.insert(k.clone(), Value::Null);
        }
    }
    if retain_keys && !patch.is_empty() {
        let mut keep: Vec<&String> = b
            .iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, _)| k)
            .collect();
        keep.sort();
        if !keep.is_empty() {
            patch.insert(
                RETAIN_KEYS.to_string(),
                Value::Array(keep.into_iter().map(|k| Value::String(k.clone())).collect()),
            );
        }
    }
    patch
}

/// Whether every item is an object with a distinct value for `key`.
fn matchable(items: &[Value], key: &str) -> bool {
    let mut seen: Vec<&Value> = Vec::with_capacity(items.len());
    for item in items {
        let Some(v) = item.as_object().and_then(|o| o.get(key)) else {
            return false;
        };
        if seen.iter().any(|s| json_eq(s, v)) {
            return false;
        }
        seen.push(v);
    }
    true
}

fn key_only(key: &str, value: &Value) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert(key.to_string(), value.clone());
    m
}

fn diff_keyed_list(
    patch: &mut Map<String, Value>,
    field: &str,
    al: &[Value],
    bl: &[Value],
    key: &str,
    item: Shape,
    retain_items: bool,
) {
    if al.is_empty() {
        if !bl.is_empty() {
            patch.insert(field.to_string(), Value::Array(bl.to_vec()));
        }
        return;
    }
    if !matchable(al, key) || !matchable(bl, key) {
        // Items cannot be told apart: send the list whole.
        if !json_eq(&Value::Array(al.to_vec()), &Value::Array(bl.to_vec())) {
            let mut items = bl.to_vec();
            if items.iter().all(Value::is_object) {
                let mut marker = Map::new();
                marker.insert(PATCH.to_string(), Value::String("replace".into()));
                items.push(Value::Object(marker));
            }
            patch.insert(field.to_string(), Value::Array(items));
        }
        return;
    }
    let empty = Map::new();
    let mut changes = Vec::new();
    for bi in bl {
        let kv = &bi[key];
        match al.iter().find(|ai| key_matches(ai, key, kv)) {
            Some(ai) => {
                let ao = ai.as_object().unwrap_or(&empty);
                let bo = bi.as_object().unwrap_or(&empty);
                let d = diff_object(ao, bo, item.for_object(), retain_items);
                if !d.is_empty() {
                    // The merge key first, as kubectl writes it.
                    let mut entry = key_only(key, kv);
                    entry.extend(d);
                    changes.push(Value::Object(entry));
                }
            }
            None => changes.push(bi.clone()),
        }
    }
    for ai in al {
        let kv = &ai[key];
        if !bl.iter().any(|bi| key_matches(bi, key, kv)) {
            let mut entry = key_only(key, kv);
            entry.insert(PATCH.to_string(), Value::String("delete".into()));
            changes.push(Value::Object(entry));
        }
    }
    let same_order = al.len() == bl.len()
        && al
            .iter()
            .zip(bl)
            .all(|(ai, bi)| key_matches(ai, key, &bi[key]));
    let changed = !changes.is_empty();
    if changed {
        patch.insert(field.to_string(), Value::Array(changes));
    }
    if (changed || !same_order) && !bl.is_empty() {
        let order = bl
            .iter()
            .map(|bi| Value::Object(key_only(key, &bi[key])))
            .collect();
        patch.insert(format!("{SET_ELEMENT_ORDER}{field}"), Value::Array(order));
    }
}

fn diff_set(patch: &mut Map<String, Value>, field: &str, al: &[Value], bl: &[Value]) {
    if al.is_empty() {
        if !bl.is_empty() {
            patch.insert(field.to_string(), Value::Array(bl.to_vec()));
        }
        return;
    }
    let contains = |list: &[Value], v: &Value| list.iter().any(|x| json_eq(x, v));
    let mut added: Vec<Value> = Vec::new();
    for v in bl {
        if !contains(al, v) && !contains(&added, v) {
            added.push(v.clone());
        }
    }
    let mut removed: Vec<Value> = Vec::new();
    for v in al {
        if !contains(bl, v) && !contains(&removed, v) {
            removed.push(v.clone());
        }
    }
    let changed = !json_eq(&Value::Array(al.to_vec()), &Value::Array(bl.to_vec()));
    if !added.is_empty() {
        patch.insert(field.to_string(), Value::Array(added));
    }
    if !removed.is_empty() {
        patch.insert(
            format!("{DELETE_FROM_PRIMITIVE_LIST}{field}"),
            Value::Array(removed),
        );
    }
    if changed && !bl.is_empty() {
        patch.insert(
            format!("{SET_ELEMENT_ORDER}{field}"),
            Value::Array(bl.to_vec()),
        );
    }
}

#[cfg(test)]
mod tests;
