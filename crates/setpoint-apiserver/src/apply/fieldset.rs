//! Sets of field paths in the `FieldsV1` form Kubernetes stores in `metadata.managedFields`.
//!
//! A set is a tree keyed by encoded path elements: `f:<field>` (an object property or map key),
//! `k:<json object of merge-key values>` (an item of an associative list), `v:<json value>` (an
//! item of a set), `i:<index>` (a position in a list that has no better identity). A node is a
//! *member* of the set when the path that leads to it is itself owned; in JSON, a member with
//! children carries a `"."` entry and a member without children is `{}`. Nodes that are not
//! members only lead to owned descendants (e.g. `f:metadata` above `f:labels`).

use serde_json::{Map, Value};

/// The key that marks a node with children as a member itself.
const SELF: &str = ".";

/// A set of field paths (see the module docs). The root is never a member.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSet {
    /// Whether the path leading here is in the set.
    member: bool,
    /// Sorted by element, each element once. A vector, not a `BTreeMap`: most nodes have a
    /// handful of children, and a map's node allocation (hundreds of bytes each, one per
    /// inner node of every set built for every write) was a measurable part of a write's cost.
    children: Vec<(String, FieldSet)>,
}

impl FieldSet {
    /// The empty set.
    pub fn new() -> FieldSet {
        FieldSet::default()
    }

    /// True when no path is in the set.
    pub fn is_empty(&self) -> bool {
        !self.member && self.children.iter().all(|(_, c)| c.is_empty())
    }

    /// The position of `elem` among the children, or where it would be inserted.
    fn find(&self, elem: &str) -> Result<usize, usize> {
        self.children
            .binary_search_by(|(k, _)| k.as_str().cmp(elem))
    }

    /// Adds `path` (encoded path elements, outermost first) as a member.
    pub fn insert(&mut self, path: &[String]) {
        let mut node = self;
        for elem in path {
            node = node.child_mut(elem);
        }
        if !path.is_empty() {
            node.member = true;
        }
    }

    /// Whether `path` is a member.
    pub fn contains(&self, path: &[String]) -> bool {
        self.node(path).is_some_and(|n| n.member) && !path.is_empty()
    }

    /// The subtree at `path`, if any path at or below it is in the set.
    pub fn node(&self, path: &[String]) -> Option<&FieldSet> {
        let mut node = self;
        for elem in path {
            node = node.child(elem)?;
        }
        (!node.is_empty()).then_some(node)
    }

    /// Marks this node itself as a member.
    pub fn set_member(&mut self) {
        self.member = true;
    }

    /// Whether this node itself is a member.
    pub fn is_member(&self) -> bool {
        self.member
    }

    /// The child node for one path element, if present.
    pub fn child(&self, elem: &str) -> Option<&FieldSet> {
        self.find(elem).ok().map(|i| &self.children[i].1)
    }

    /// The child nodes by encoded path element.
    pub fn children(&self) -> impl Iterator<Item = (&String, &FieldSet)> {
        self.children.iter().map(|(k, c)| (k, c))
    }

    /// The child node for one path element, created on demand.
    pub fn child_mut(&mut self, elem: &str) -> &mut FieldSet {
        let i = match self.find(elem) {
            Ok(i) => i,
            Err(i) => {
                self.children.insert(i, (elem.to_string(), FieldSet::new()));
                i
            }
        };
        &mut self.children[i].1
    }

    /// Every member path, outermost element first, in key order.
    #[cfg(test)]
    pub fn members(&self) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        self.collect(&mut Vec::new(), &mut out, false);
        out
    }

    /// The member paths without member descendants: the scalar values, atomic values and empty
    /// objects the set owns.
    pub fn leaves(&self) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        self.collect(&mut Vec::new(), &mut out, true);
        out
    }

    fn collect(&self, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>, leaves_only: bool) {
        let has_member_below = self.children.iter().any(|(_, c)| !c.is_empty());
        if self.member && !(leaves_only && has_member_below) {
            out.push(prefix.clone());
        }
        for (k, c) in &self.children {
            prefix.push(k.clone());
            c.collect(prefix, out, leaves_only);
            prefix.pop();
        }
    }

    /// The paths in either set.
    pub fn union(&self, other: &FieldSet) -> FieldSet {
        self.clone().union_with(other.clone())
    }

    /// [`Self::union`], moving both sets' nodes into the result instead of copying them (a
    /// create's whole field set becomes its manager's entry without a copy).
    pub fn union_with(mut self, other: FieldSet) -> FieldSet {
        if self.is_empty() {
            return other.pruned();
        }
        self.member |= other.member;
        for (k, c) in other.children {
            match self.find(&k) {
                Ok(i) => {
                    let mine = std::mem::take(&mut self.children[i].1);
                    self.children[i].1 = mine.union_with(c);
                }
                Err(i) => self.children.insert(i, (k, c)),
            }
        }
        self.pruned()
    }

    /// The paths of `self` that are not in `other`.
    pub fn difference(&self, other: &FieldSet) -> FieldSet {
        let children = self
            .children
            .iter()
            .map(|(k, c)| {
                let rest = match other.child(k) {
                    Some(o) => c.difference(o),
                    None => c.clone(),
                };
                (k.clone(), rest)
            })
            .collect();
        FieldSet {
            member: self.member && !other.member,
            children,
        }
        .pruned()
    }

    /// The paths in both sets.
    pub fn intersection(&self, other: &FieldSet) -> FieldSet {
        let children = self
            .children
            .iter()
            .filter_map(|(k, c)| other.child(k).map(|o| (k.clone(), c.intersection(o))))
            .collect();
        FieldSet {
            member: self.member && other.member,
            children,
        }
        .pruned()
    }

    /// Drops subtrees that hold no member.
    fn pruned(mut self) -> FieldSet {
        self.children.retain(|(_, c)| !c.is_empty());
        self
    }

    /// The `FieldsV1` JSON form.
    #[cfg(test)]
    pub fn to_json(&self) -> Value {
        self.clone().into_json()
    }

    /// [`Self::to_json`], moving the path elements into the JSON instead of copying them.
    pub fn into_json(self) -> Value {
        self.into_json_if_any()
            .unwrap_or_else(|| Value::Object(Map::new()))
    }

    /// [`Self::into_json`] in one pass over the tree; `None` for an empty set (a child that
    /// holds no path is left out).
    fn into_json_if_any(self) -> Option<Value> {
        let mut map = Map::new();
        if self.member {
            map.insert(SELF.into(), Value::Object(Map::new()));
        }
        for (k, c) in self.children {
            if let Some(v) = c.into_json_if_any() {
                map.insert(k, v);
            }
        }
        match map.len() {
            0 => None,
            // A member without children is `{}`, without the `.` marker.
            1 if self.member => Some(Value::Object(Map::new())),
            _ => Some(Value::Object(map)),
        }
    }

    /// Decodes the `FieldsV1` JSON form. Every key must be `.` or a known path element kind and
    /// every value an object.
    pub fn from_json(v: &Value) -> Result<FieldSet, String> {
        let mut root = decode(v)?;
        // The root stands for the whole object, which is never owned as such.
        root.member = false;
        Ok(root)
    }
}

/// Whether the `FieldsV1` JSON `json` and `set` have a member path in common, read without
/// decoding `json`: only where `set` leads is looked at. `None` if `json` is malformed there.
/// An absent (`null`) field set has no members.
pub fn json_intersects(json: &Value, set: &FieldSet) -> Option<bool> {
    let map = match json {
        Value::Null => return Some(false),
        Value::Object(map) => map,
        _ => return None,
    };
    for (k, child) in &set.children {
        let Some(below) = map.get(k) else {
            continue;
        };
        let Value::Object(below_map) = below else {
            return None;
        };
        let member = below_map.is_empty() || below_map.contains_key(SELF);
        if (child.member && member) || json_intersects(below, child)? {
            return Some(true);
        }
    }
    Some(false)
}

/// Whether the `FieldsV1` JSON `json` (absent: `None` or `null`) holds no path, as
/// [`FieldSet::from_json`] would decode it: the root itself is never a member, and any other
/// key is (or leads to) one.
pub fn json_is_empty(json: Option<&Value>) -> bool {
    match json {
        Some(Value::Object(map)) => map.keys().all(|k| k == SELF),
        _ => true,
    }
}

fn decode(v: &Value) -> Result<FieldSet, String> {
    let Value::Object(map) = v else {
        return Err(format!("expected an object in fieldsV1, got {v}"));
    };
    let mut node = FieldSet {
        // `{}` is a member without children; a member with children says so with `.`.
        member: map.is_empty() || map.contains_key(SELF),
        children: Vec::with_capacity(map.len()),
    };
    for (k, c) in map {
        if k == SELF {
            continue;
        }
        check_element(k)?;
        node.children.push((k.clone(), decode(c)?));
    }
    // Kubernetes orders path elements by their kind, not by their text.
    node.children.sort_unstable_by(|(a, _), (b, _)| a.cmp(b));
    Ok(node)
}

/// Validates one encoded path element.
fn check_element(k: &str) -> Result<(), String> {
    let bad = || format!("invalid path element {k:?} in fieldsV1");
    let (kind, rest) = k.split_once(':').ok_or_else(bad)?;
    match kind {
        "f" if !rest.is_empty() => Ok(()),
        "k" => match serde_json::from_str::<Value>(rest) {
            Ok(Value::Object(_)) => Ok(()),
            _ => Err(bad()),
        },
        "v" => serde_json::from_str::<Value>(rest)
            .map(|_| ())
            .map_err(|_| bad()),
        "i" => rest.parse::<usize>().map(|_| ()).map_err(|_| bad()),
        _ => Err(bad()),
    }
}

/// `f:<name>`.
pub fn field(name: &str) -> String {
    format!("f:{name}")
}

/// `k:<json>` for an associative list item whose merge keys have the values in `keys`.
pub fn key(keys: &Map<String, Value>) -> String {
    format!("k:{}", Value::Object(keys.clone()))
}

/// `v:<json>` for an item of a set.
pub fn value(v: &Value) -> String {
    format!("v:{v}")
}

/// `i:<n>`.
pub fn index(i: usize) -> String {
    format!("i:{i}")
}

/// A path as Kubernetes prints it in conflicts: `.spec.replicas`,
/// `.spec.template.spec.containers[name="nginx"].image`, `.metadata.finalizers[="x"]`.
pub fn display(path: &[String]) -> String {
    let mut out = String::new();
    for elem in path {
        let (kind, rest) = elem.split_once(':').unwrap_or(("f", elem));
        match kind {
            "k" => {
                let parts: Vec<String> = match serde_json::from_str::<Value>(rest) {
                    Ok(Value::Object(m)) => m.iter().map(|(k, v)| format!("{k}={v}")).collect(),
                    _ => vec![rest.to_string()],
                };
                out.push_str(&format!("[{}]", parts.join(",")));
            }
            "v" => out.push_str(&format!("[={rest}]")),
            "i" => out.push_str(&format!("[{rest}]")),
            _ => {
                out.push('.');
                out.push_str(rest);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(elems: &[&str]) -> Vec<String> {
        elems.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn round_trips_fields_v1() {
        let v = json!({
            "f:metadata": {"f:labels": {"f:app": {}}},
            "f:spec": {
                "f:replicas": {},
                "f:template": {"f:spec": {"f:containers": {
                    "k:{\"name\":\"main\"}": {".": {}, "f:image": {}, "f:name": {}}
                }}}
            }
        });
        let set = FieldSet::from_json(&v).unwrap();
        assert_eq!(set.to_json(), v);
        assert!(set.contains(&p(&["f:spec", "f:replicas"])));
        assert!(!set.contains(&p(&["f:spec"])));
        assert!(set.contains(&p(&[
            "f:spec",
            "f:template",
            "f:spec",
            "f:containers",
            "k:{\"name\":\"main\"}"
        ])));
        assert_eq!(set.members().len(), 5);
        assert_eq!(set.leaves().len(), 4);
    }

    proptest::proptest! {
        /// Any set, including one with branches that lead to no member, survives its JSON form
        /// (an empty branch written out would come back as a member).
        #[test]
        fn json_form_round_trips(
            paths in proptest::collection::vec(
                proptest::collection::vec(
                    proptest::sample::select(vec!["f:a", "f:b", "f:c"]),
                    1..4,
                ),
                0..12,
            ),
            drop in proptest::collection::vec(
                proptest::collection::vec(
                    proptest::sample::select(vec!["f:a", "f:b", "f:c"]),
                    1..4,
                ),
                0..6,
            ),
        ) {
            let mut set = FieldSet::new();
            for path in &paths {
                set.insert(&p(path));
            }
            let mut gone = FieldSet::new();
            for path in &drop {
                gone.insert(&p(path));
            }
            let mut set = set.difference(&gone);
            // Branches that lead to no member, as building a set step by step leaves them.
            for path in &drop {
                let mut node = &mut set;
                for elem in path {
                    node = node.child_mut(elem);
                }
            }
            let json = set.to_json();
            let back = FieldSet::from_json(&json).unwrap();
            proptest::prop_assert_eq!(back.members(), set.members());
            proptest::prop_assert_eq!(back.to_json(), json.clone());
        }

        /// Union (copying or moving), difference and intersection give what the same
        /// operations give on plain sets of member paths, and members come out sorted.
        #[test]
        fn algebra_matches_sets_of_paths(
            a in proptest::collection::vec(
                proptest::collection::vec(
                    proptest::sample::select(vec!["f:a", "f:b", "k:{\"n\":\"x\"}", "i:0"]),
                    1..4,
                ),
                0..10,
            ),
            b in proptest::collection::vec(
                proptest::collection::vec(
                    proptest::sample::select(vec!["f:a", "f:b", "k:{\"n\":\"x\"}", "i:0"]),
                    1..4,
                ),
                0..10,
            ),
        ) {
            use std::collections::BTreeSet;
            let build = |paths: &[Vec<&str>]| {
                let mut set = FieldSet::new();
                for path in paths {
                    set.insert(&p(path));
                }
                set
            };
            let plain = |paths: &[Vec<&str>]| -> BTreeSet<Vec<String>> {
                paths.iter().map(|path| p(path)).collect()
            };
            let (sa, sb) = (build(&a), build(&b));
            let (pa, pb) = (plain(&a), plain(&b));
            let members = |set: &FieldSet| -> BTreeSet<Vec<String>> {
                set.members().into_iter().collect()
            };
            let union: BTreeSet<_> = pa.union(&pb).cloned().collect();
            proptest::prop_assert_eq!(members(&sa.union(&sb)), union.clone());
            proptest::prop_assert_eq!(sa.clone().union_with(sb.clone()), sa.union(&sb));
            let difference: BTreeSet<_> = pa.difference(&pb).cloned().collect();
            proptest::prop_assert_eq!(members(&sa.difference(&sb)), difference);
            let intersection: BTreeSet<_> = pa.intersection(&pb).cloned().collect();
            proptest::prop_assert_eq!(members(&sa.intersection(&sb)), intersection);
            let listed = sa.members();
            let mut sorted = listed.clone();
            sorted.sort();
            proptest::prop_assert_eq!(listed, sorted);
        }
    }

    #[test]
    fn decodes_keys_in_any_order() {
        // Kubernetes orders path elements by kind, not by their text.
        let set = FieldSet::from_json(&json!({
            "f:spec": {"f:z": {}, "f:a": {}},
            "f:metadata": {"f:labels": {".": {}, "f:b": {}, "f:a": {}}},
        }))
        .unwrap();
        assert!(set.contains(&p(&["f:spec", "f:a"])));
        assert!(set.contains(&p(&["f:metadata", "f:labels"])));
        assert_eq!(
            set.to_json(),
            json!({
                "f:metadata": {"f:labels": {".": {}, "f:a": {}, "f:b": {}}},
                "f:spec": {"f:a": {}, "f:z": {}},
            })
        );
        assert_eq!(
            serde_json::to_string(&set.to_json()).unwrap(),
            r#"{"f:metadata":{"f:labels":{".":{},"f:a":{},"f:b":{}}},"f:spec":{"f:a":{},"f:z":{}}}"#
        );
    }

    #[test]
    fn rejects_malformed_elements() {
        assert!(FieldSet::from_json(&json!({"x:y": {}})).is_err());
        assert!(FieldSet::from_json(&json!({"k:notjson": {}})).is_err());
        assert!(FieldSet::from_json(&json!({"f:a": 1})).is_err());
        assert!(FieldSet::from_json(&json!([])).is_err());
    }

    #[test]
    fn stored_json_is_judged_as_its_decoded_set() {
        let stored = json!({"f:metadata": {"f:labels": {"f:a": {}}},
            "f:spec": {".": {}, "f:x": {}}});
        let set = |v: Value| FieldSet::from_json(&v).unwrap();
        for (other, want) in [
            (json!({"f:metadata": {"f:labels": {"f:a": {}}}}), true),
            (json!({"f:metadata": {"f:labels": {".": {}}}}), false),
            (json!({"f:spec": {}}), true),
            (json!({"f:spec": {"f:y": {}}}), false),
            (json!({}), false),
        ] {
            let other = set(other);
            assert_eq!(json_intersects(&stored, &other), Some(want), "{other:?}");
            assert_eq!(!set(stored.clone()).intersection(&other).is_empty(), want);
        }
        assert_eq!(
            json_intersects(&Value::Null, &set(json!({"f:a": {}}))),
            Some(false)
        );
        assert_eq!(
            json_intersects(&json!({"f:a": 1}), &set(json!({"f:a": {}}))),
            None
        );
        for (v, empty) in [
            (Some(json!({})), true),
            (Some(json!({".": {}})), true),
            (None, true),
            (Some(json!({"f:a": {}})), false),
        ] {
            assert_eq!(json_is_empty(v.as_ref()), empty, "{v:?}");
            if let Some(v) = v {
                assert_eq!(set(v).is_empty(), empty);
            }
        }
    }

    #[test]
    fn set_algebra() {
        let mut a = FieldSet::new();
        a.insert(&p(&["f:spec", "f:replicas"]));
        a.insert(&p(&["f:spec", "f:paused"]));
        let mut b = FieldSet::new();
        b.insert(&p(&["f:spec", "f:replicas"]));
        b.insert(&p(&["f:metadata", "f:labels", "f:x"]));

        let u = a.union(&b);
        assert_eq!(u.leaves().len(), 3);
        let d = a.difference(&b);
        assert_eq!(d.leaves(), vec![p(&["f:spec", "f:paused"])]);
        let i = a.intersection(&b);
        assert_eq!(i.leaves(), vec![p(&["f:spec", "f:replicas"])]);
        assert!(a.difference(&a).is_empty());
        assert_eq!(a.difference(&a).to_json(), json!({}));
    }

    #[test]
    fn displays_paths_like_kubernetes() {
        assert_eq!(display(&p(&["f:spec", "f:replicas"])), ".spec.replicas");
        assert_eq!(
            display(&p(&[
                "f:spec",
                "f:containers",
                "k:{\"name\":\"nginx\"}",
                "f:image"
            ])),
            ".spec.containers[name=\"nginx\"].image"
        );
        assert_eq!(
            display(&p(&["f:metadata", "f:finalizers", "v:\"x\""])),
            ".metadata.finalizers[=\"x\"]"
        );
    }
}
