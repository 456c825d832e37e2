//! Server-side apply and field ownership (`metadata.managedFields`).
//!
//! Every write records which manager set which fields. Apply requests
//! (`application/apply-patch+yaml`) carry a manager's whole intent: the applied configuration is
//! merged into the live object by the type graph's list semantics ([`merge`]), fields the manager
//! applied before but omits now are removed unless someone else owns them too, and changing a
//! field another manager owns is a conflict unless forced. Other writes (create, update, merge,
//! JSON and strategic patches) record an `Update` entry for the fields they changed and take those
//! fields away from everyone else, as Kubernetes does.
//!
//! Field sets are kept in the `FieldsV1` form ([`fieldset`]). Server-owned fields (`apiVersion`,
//! `kind`, name, namespace, uid, resourceVersion, generation, timestamps, `managedFields` itself,
//! and `status` for main-resource writes of kinds with a status subresource) are never owned.

pub mod fieldset;
pub mod merge;

use std::borrow::Cow;

use serde_json::{json, Map, Value};
use setpoint_api::{meta, ApiError, Cause};
use setpoint_protobuf::types;

use crate::registry::ResourceDef;
use crate::strategy::View;
use fieldset::FieldSet;
use merge::Shape;

/// `operation` of an entry written by server-side apply.
pub const APPLY: &str = "Apply";
/// `operation` of an entry written by any other write.
pub const UPDATE: &str = "Update";

/// The manager recorded when a non-apply write names none.
pub const DEFAULT_MANAGER: &str = "unknown";

/// Metadata fields only the server sets; nobody owns them.
const SERVER_METADATA: &[&str] = &[
    "name",
    "namespace",
    "generateName",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
];

/// One `managedFields` entry.
#[derive(Clone, Debug, PartialEq)]
struct Entry {
    manager: String,
    operation: String,
    api_version: String,
    time: Option<String>,
    subresource: Option<String>,
    fields: FieldSet,
}

impl Entry {
    fn is(&self, manager: &str, operation: &str, subresource: Option<&str>) -> bool {
        self.manager == manager
            && self.operation == operation
            && self.subresource.as_deref() == subresource
    }

    fn parse(v: &Value) -> Result<Entry, String> {
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        let manager = s("manager").unwrap_or_default();
        let operation = s("operation").unwrap_or_default();
        if operation != APPLY && operation != UPDATE {
            return Err(format!(
                "operation must be Apply or Update, got {operation:?}"
            ));
        }
        if let Some(ft) = s("fieldsType") {
            if ft != "FieldsV1" {
                return Err(format!("fieldsType must be FieldsV1, got {ft:?}"));
            }
        }
        let fields = match v.get("fieldsV1") {
            Some(f) => FieldSet::from_json(f)?,
            None => FieldSet::new(),
        };
        Ok(Entry {
            manager,
            operation,
            api_version: s("apiVersion").unwrap_or_default(),
            time: s("time"),
            subresource: s("subresource").filter(|s| !s.is_empty()),
            fields,
        })
    }

    fn into_json(self) -> Value {
        let mut m = Map::new();
        m.insert("manager".into(), Value::String(self.manager));
        m.insert("operation".into(), Value::String(self.operation));
        m.insert("apiVersion".into(), Value::String(self.api_version));
        if let Some(t) = self.time {
            m.insert("time".into(), Value::String(t));
        }
        m.insert("fieldsType".into(), json!("FieldsV1"));
        m.insert("fieldsV1".into(), self.fields.into_json());
        if let Some(s) = self.subresource {
            m.insert("subresource".into(), Value::String(s));
        }
        Value::Object(m)
    }
}

/// The entries of `obj`, `None` when `managedFields` is absent, `Err` when it is malformed.
fn entries_of(obj: &Value) -> Result<Option<Vec<Entry>>, String> {
    match meta::metadata(obj).and_then(|m| m.get("managedFields")) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => items
            .iter()
            .map(Entry::parse)
            .collect::<Result<_, _>>()
            .map(Some),
        Some(_) => Err("managedFields must be a list".into()),
    }
}

/// Writes `entries` (without empty ones) as `metadata.managedFields`.
fn set_entries(obj: &mut Value, entries: Vec<Entry>) {
    set_entries_reusing(obj, entries, &[]);
}

/// [`set_entries`], taking entry `i`'s JSON from `stored[i]` when that is `Some` (the entry as
/// it was read, unchanged) instead of serializing it again.
fn set_entries_reusing(obj: &mut Value, entries: Vec<Entry>, stored: &[Option<&Value>]) {
    let list: Vec<Value> = entries
        .into_iter()
        .enumerate()
        .filter(|(_, e)| !e.fields.is_empty())
        .map(|(i, e)| match stored.get(i).copied().flatten() {
            Some(json) => json.clone(),
            None => e.into_json(),
        })
        .collect();
    set_items(obj, list);
}

/// Writes `items` as `metadata.managedFields`; an empty list removes the field.
fn set_items(obj: &mut Value, items: Vec<Value>) {
    if items.is_empty() {
        meta::remove_meta(obj, "managedFields");
    } else {
        meta::set_meta(obj, "managedFields", Value::Array(items));
    }
}

/// The field at `path` (`spec.containers[0].image`) of `obj`, an object of `res`, as Kubernetes'
/// structured merge prints it: `.spec.containers[name="nginx"].image` (list items by their keys
/// or values, where the schema says how they are identified).
pub fn display_path(res: &ResourceDef, obj: &Value, path: &str) -> String {
    let steps: Vec<merge::PathStep<'_>> = crate::decoding::split_path(path)
        .into_iter()
        .map(|s| match s {
            crate::decoding::Segment::Key(k) => merge::PathStep::Key(k),
            crate::decoding::Segment::Index(i) => merge::PathStep::Index(i),
        })
        .collect();
    fieldset::display(&merge::elements_at(shape_of(res), obj, &steps))
}

/// The schema shape of objects of `res`; kinds the type graph does not know are untyped (all
/// lists atomic).
fn shape_of(res: &ResourceDef) -> Shape {
    types::for_kind(&res.group, &res.version, &res.kind).map_or(Shape::Untyped, Shape::Type)
}

/// The subresource name recorded for writes through `view`.
pub fn subresource(view: View) -> Option<&'static str> {
    view.name()
}

/// The part of `obj` whose fields can be owned through `subresource`: without server-owned
/// fields, and only `status` for the status subresource (without it for the main resource of
/// kinds that have one).
fn ownable(res: &ResourceDef, obj: &Value, subresource: Option<&str>) -> Value {
    ownable_props(res, obj, subresource).into_value()
}

/// [`ownable`] as borrowed properties: only a filtered `metadata` is copied.
fn ownable_props<'a>(
    res: &ResourceDef,
    obj: &'a Value,
    subresource: Option<&str>,
) -> merge::Props<'a> {
    let mut out = merge::Props::default();
    let Some(map) = obj.as_object() else {
        return out;
    };
    for (k, v) in map {
        let kept = match k.as_str() {
            "status" => subresource == Some("status") || !res.status,
            _ if subresource == Some("status") => false,
            "apiVersion" | "kind" => false,
            _ => true,
        };
        if !kept {
            continue;
        }
        match v {
            Value::Object(m) if k == "metadata" && subresource != Some("status") => {
                let ownable: serde_json::Map<String, Value> = m
                    .iter()
                    .filter(|(f, _)| !SERVER_METADATA.contains(&f.as_str()))
                    .map(|(f, v)| (f.clone(), v.clone()))
                    .collect();
                if !ownable.is_empty() {
                    out.push(k, Cow::Owned(Value::Object(ownable)));
                }
            }
            _ => out.push(k, Cow::Borrowed(v)),
        }
    }
    out
}

/// Records an `Update` by `manager` through `subresource` that turned `old` (`None` for a create)
/// into `new`: the fields it set or changed become the manager's and nobody else's, the fields
/// it removed are nobody's.
///
/// Client-supplied `managedFields` in `new` that differ from `old`'s replace them when valid
/// (kubectl rewrites them when migrating to server-side apply); an explicitly empty list clears
/// ownership without recording this write.
pub fn record_update(
    res: &ResourceDef,
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    subresource: Option<&str>,
    now: &str,
) {
    record(res, old, new, manager, subresource, now, true);
}

/// [`record_update`]; without `shortcut`, every old entry is parsed and judged (the reference
/// the shortcut is tested against).
fn record(
    res: &ResourceDef,
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    subresource: Option<&str>,
    now: &str,
    shortcut: bool,
) {
    let old_items = old.and_then(|o| o.pointer("/metadata/managedFields"));
    let supplied = new
        .pointer("/metadata/managedFields")
        .filter(|v| Some(*v) != old_items)
        .cloned();
    let shape = shape_of(res);
    let before = old.map_or_else(merge::Props::default, |o| {
        ownable_props(res, o, subresource)
    });
    let after = ownable_props(res, new, subresource);
    let changed = merge::changed_props(&before, &after, shape);
    let removed = merge::removed_props(&before, &after, shape);
    if shortcut && supplied.is_none() {
        if let Some(Value::Array(items)) = old_items {
            let write = Write {
                manager,
                subresource,
                changed: &changed,
                removed: &removed,
                now,
                api_version: res.api_version(),
            };
            if let Some(list) = write.touching_only_what_it_affects(items) {
                drop((before, after));
                set_items(new, list);
                return;
            }
        }
    }
    let old_entries = old
        .and_then(|o| entries_of(o).ok().flatten())
        .unwrap_or_default();
    // The stored JSON of each old entry, reused for the entries this write leaves as they were.
    let old_json: Vec<Option<&Value>> = match old_items {
        Some(Value::Array(items)) if items.len() == old_entries.len() => {
            items.iter().map(Some).collect()
        }
        _ => Vec::new(),
    };
    let (mut entries, mut unchanged) = match supplied {
        Some(Value::Array(items)) if items.is_empty() => {
            meta::remove_meta(new, "managedFields");
            return;
        }
        Some(_) => match entries_of(new) {
            Ok(Some(e)) => (e, Vec::new()),
            _ => (old_entries, old_json),
        },
        None => (old_entries, old_json),
    };
    if !changed.is_empty() || !removed.is_empty() {
        for (i, e) in entries.iter_mut().enumerate() {
            let mut fields = e.fields.difference(&removed);
            if !e.is(manager, UPDATE, subresource) {
                fields = fields.difference(&changed);
            }
            if fields != e.fields {
                e.fields = fields;
                forget(&mut unchanged, i);
            }
        }
        if !changed.is_empty() {
            let i = position_or_insert(&mut entries, manager, UPDATE, subresource);
            entries[i].fields = std::mem::take(&mut entries[i].fields).union_with(changed);
            entries[i].time = Some(now.to_string());
            entries[i].api_version = res.api_version();
            forget(&mut unchanged, i);
        }
    }
    set_entries_reusing(new, entries, &unchanged);
}

/// One `Update` as [`record_update`] records it: who wrote through which subresource, and the
/// fields the write set or changed and those it removed.
struct Write<'a> {
    manager: &'a str,
    subresource: Option<&'a str>,
    changed: &'a FieldSet,
    removed: &'a FieldSet,
    now: &'a str,
    api_version: String,
}

/// An old entry as [`Write::touching_only_what_it_affects`] holds it: as stored, or parsed
/// because the write changes it.
enum Slot<'a> {
    Stored(&'a Value),
    Parsed(Entry),
}

impl Write<'_> {
    /// The new `managedFields` from the stored `items`, parsing and writing again only the
    /// entries this write changes: those that own a field it removed, those of other managers
    /// that own a field it changed, and the writer's own. The rest are copied as stored. On a
    /// pod's status report that leaves the controller's entry, most of the list, unparsed.
    ///
    /// Gives what the full computation in [`record_update`] gives; `None` (for that
    /// computation to run instead) when an entry it needs to read is malformed.
    fn touching_only_what_it_affects(&self, items: &[Value]) -> Option<Vec<Value>> {
        let mut slots = Vec::with_capacity(items.len() + 1);
        let mut mine_at = None;
        for item in items {
            let mine = entry_is(item, self.manager, UPDATE, self.subresource)?;
            let first_mine = mine && mine_at.is_none();
            if first_mine {
                mine_at = Some(slots.len());
            }
            let fields = item.get("fieldsV1").unwrap_or(&Value::Null);
            let touched = (first_mine && !self.changed.is_empty())
                || fieldset::json_intersects(fields, self.removed)?
                || (!mine && fieldset::json_intersects(fields, self.changed)?);
            if !touched {
                slots.push(Slot::Stored(item));
                continue;
            }
            let mut e = Entry::parse(item).ok()?;
            e.fields = e.fields.difference(self.removed);
            if !mine {
                e.fields = e.fields.difference(self.changed);
            }
            slots.push(Slot::Parsed(e));
        }
        if !self.changed.is_empty() {
            let i = match mine_at {
                Some(i) => i,
                None => {
                    slots.push(Slot::Parsed(Entry {
                        manager: self.manager.to_string(),
                        operation: UPDATE.to_string(),
                        api_version: String::new(),
                        time: None,
                        subresource: self.subresource.map(str::to_string),
                        fields: FieldSet::new(),
                    }));
                    slots.len() - 1
                }
            };
            if let Some(Slot::Parsed(e)) = slots.get_mut(i) {
                e.fields = std::mem::take(&mut e.fields).union_with(self.changed.clone());
                e.time = Some(self.now.to_string());
                e.api_version = self.api_version.clone();
            }
        }
        Some(
            slots
                .into_iter()
                .filter_map(|s| match s {
                    Slot::Stored(v) => {
                        (!fieldset::json_is_empty(v.get("fieldsV1"))).then(|| v.clone())
                    }
                    Slot::Parsed(e) => (!e.fields.is_empty()).then(|| e.into_json()),
                })
                .collect(),
        )
    }
}

/// Whether the stored entry `v` is `manager`'s `operation` through `subresource`; `None` if
/// its operation or fields type is not one an entry can have (as [`Entry::parse`] checks).
fn entry_is(v: &Value, manager: &str, operation: &str, subresource: Option<&str>) -> Option<bool> {
    let s = |k: &str| v.get(k).and_then(Value::as_str);
    let op = s("operation").unwrap_or("");
    if op != APPLY && op != UPDATE {
        return None;
    }
    if s("fieldsType").is_some_and(|t| t != "FieldsV1") {
        return None;
    }
    let sub = s("subresource").filter(|s| !s.is_empty());
    Some(s("manager").unwrap_or("") == manager && op == operation && sub == subresource)
}

/// Marks entry `i` as changed (its stored JSON can no longer be reused).
fn forget(unchanged: &mut [Option<&Value>], i: usize) {
    if let Some(slot) = unchanged.get_mut(i) {
        *slot = None;
    }
}

fn position_or_insert(
    entries: &mut Vec<Entry>,
    manager: &str,
    operation: &str,
    subresource: Option<&str>,
) -> usize {
    if let Some(i) = entries
        .iter()
        .position(|e| e.is(manager, operation, subresource))
    {
        return i;
    }
    entries.push(Entry {
        manager: manager.to_string(),
        operation: operation.to_string(),
        api_version: String::new(),
        time: None,
        subresource: subresource.map(str::to_string),
        fields: FieldSet::new(),
    });
    entries.len() - 1
}

/// An apply request: who applies what, and whether conflicts are overridden.
pub struct Apply<'a> {
    pub manager: &'a str,
    pub config: &'a Value,
    pub subresource: Option<&'a str>,
    pub force: bool,
    /// Whether entries recorded in another version than the request's are left to
    /// [`Apply::settle_version`], which sees the object as their version shows it (a custom
    /// resource applied through a version it is not stored in); otherwise every entry's paths
    /// are compared in the request's version.
    pub versioned: bool,
}

impl Apply<'_> {
    /// The ownable part of the configuration. A `null` in an apply configuration sets nothing
    /// (so a field the manager applied before and now sets to `null` is removed like an omitted
    /// one).
    fn ownable_config(&self, res: &ResourceDef) -> Value {
        let mut config = ownable(res, self.config, self.subresource);
        merge::strip_nulls(&mut config);
        config
    }

    /// The object to create when the applied object does not exist yet: the configuration, with
    /// the manager's `Apply` entry for it.
    pub fn new_object(&self, res: &ResourceDef, now: &str) -> Value {
        let mut obj = self.config.clone();
        merge::strip_nulls(&mut obj);
        let applied = merge::fields_of(&self.ownable_config(res), shape_of(res));
        let entry = Entry {
            manager: self.manager.to_string(),
            operation: APPLY.to_string(),
            api_version: res.api_version(),
            time: Some(now.to_string()),
            subresource: self.subresource.map(str::to_string),
            fields: applied,
        };
        set_entries(&mut obj, vec![entry]);
        obj
    }

    /// Merges the configuration into `live` and returns the object to store (before the usual
    /// update preparation and defaulting), with updated `managedFields`. A changed value owned by
    /// another manager is a 409 `Conflict` unless forced; forcing takes the field away from them.
    pub fn apply_to(&self, res: &ResourceDef, live: &Value, now: &str) -> Result<Value, ApiError> {
        let shape = shape_of(res);
        let mut entries = entries_of(live).ok().flatten().unwrap_or_default();
        let config = self.ownable_config(res);
        let applied = merge::fields_of(&config, shape);
        let live_part = ownable(res, live, self.subresource);
        let mine = |e: &Entry| e.is(self.manager, APPLY, self.subresource);
        let version = res.api_version();
        let compared_here = |e: &Entry| !self.versioned || self.in_version(e, &version);

        let mut conflicts: Vec<(usize, Vec<String>)> = Vec::new();
        for path in applied.leaves() {
            let want = merge::value_at(&config, &path, shape);
            let have = merge::value_at(&live_part, &path, shape);
            if have.is_none() || want == have {
                continue;
            }
            for (i, e) in entries.iter().enumerate() {
                if !mine(e) && compared_here(e) && e.fields.contains(&path) {
                    conflicts.push((i, path.clone()));
                }
            }
        }
        if !conflicts.is_empty() {
            if !self.force {
                return Err(conflict_error(res, live, &entries, &conflicts));
            }
            for (i, path) in &conflicts {
                let mut one = FieldSet::new();
                one.insert(path);
                entries[*i].fields = entries[*i].fields.difference(&one);
            }
        }

        let previous = entries
            .iter()
            .find(|e| mine(e))
            .map(|e| e.fields.clone())
            .unwrap_or_default();
        let others = entries
            .iter()
            .filter(|e| !mine(e))
            .fold(FieldSet::new(), |acc, e| acc.union(&e.fields));
        let mut merged = merge::merge(live, &config, shape);
        let gone = previous.difference(&applied).difference(&others);
        merge::remove(&mut merged, &gone, &others, shape);
        // A resourceVersion in the configuration is a precondition, checked by the caller.
        if let Some(rv) = self.config.pointer("/metadata/resourceVersion") {
            meta::set_meta(&mut merged, "resourceVersion", rv.clone());
        }

        let i = position_or_insert(&mut entries, self.manager, APPLY, self.subresource);
        entries[i].fields = applied;
        entries[i].time = Some(now.to_string());
        entries[i].api_version = res.api_version();
        set_entries(&mut merged, entries);
        Ok(merged)
    }

    /// Whether `e` was recorded in `api_version` (an entry without one is taken to be).
    fn in_version(&self, e: &Entry, api_version: &str) -> bool {
        e.api_version.is_empty() || e.api_version == api_version
    }

    /// The versions, other than `res`'s, that other managers' entries of `merged` (the result
    /// of [`Apply::apply_to`]) were recorded in: each is settled by [`Apply::settle_version`].
    pub fn other_versions(&self, res: &ResourceDef, merged: &Value) -> Vec<String> {
        let version = res.api_version();
        let mut out: Vec<String> = Vec::new();
        for e in entries_of(merged).ok().flatten().unwrap_or_default() {
            let mine = e.is(self.manager, APPLY, self.subresource);
            if !mine && !self.in_version(&e, &version) && !out.contains(&e.api_version) {
                out.push(e.api_version);
            }
        }
        out
    }

    /// Upstream's ownership rule for the managers that recorded their fields in
    /// `api_version`, with the object before (`live`) and after the apply (`applied`) as that
    /// version shows them: a field the apply changed that such a manager owns is a conflict
    /// (a 409 unless forced, when it is taken from them), and a field it removed is nobody's.
    /// Updates `merged`'s entries.
    pub fn settle_version(
        &self,
        res: &ResourceDef,
        merged: &mut Value,
        api_version: &str,
        live: &Value,
        applied: &Value,
    ) -> Result<(), ApiError> {
        let mine = |e: &Entry| e.is(self.manager, APPLY, self.subresource);
        let written = SeenIn {
            live,
            new: applied,
            subresource: self.subresource,
        };
        written.settle(res, merged, api_version, self.force, mine)
    }
}

/// A write as the managers of one version see it: the object before (`live`) and after
/// (`new`), both as that version shows them, through `subresource`.
struct SeenIn<'v> {
    live: &'v Value,
    new: &'v Value,
    subresource: Option<&'v str>,
}

impl SeenIn<'_> {
    /// Upstream's ownership rule for the entries of `merged` recorded in `api_version` (but
    /// those `skip` says are the writer's own): a field the write changed that one owns is a
    /// conflict (a 409 unless `force`, when it is taken from it), and a field it removed is
    /// nobody's.
    fn settle(
        &self,
        res: &ResourceDef,
        merged: &mut Value,
        api_version: &str,
        force: bool,
        skip: impl Fn(&Entry) -> bool,
    ) -> Result<(), ApiError> {
        let shape = shape_of(res);
        let before = ownable_props(res, self.live, self.subresource);
        let after = ownable_props(res, self.new, self.subresource);
        let changed = merge::changed_props(&before, &after, shape);
        let removed = merge::removed_props(&before, &after, shape);
        drop((before, after));
        let Ok(Some(mut entries)) = entries_of(merged) else {
            return Ok(());
        };
        let theirs = |e: &Entry| e.api_version == api_version && !skip(e);
        let conflicts: Vec<(usize, Vec<String>)> = entries
            .iter()
            .enumerate()
            .filter(|(_, e)| theirs(e))
            .flat_map(|(i, e)| {
                e.fields
                    .intersection(&changed)
                    .leaves()
                    .into_iter()
                    .map(move |path| (i, path))
            })
            .collect();
        if !conflicts.is_empty() && !force {
            return Err(conflict_error(res, merged, &entries, &conflicts));
        }
        for e in entries.iter_mut().filter(|e| theirs(e)) {
            e.fields = e.fields.difference(&removed);
            if force {
                e.fields = e.fields.difference(&changed);
            }
        }
        set_entries(merged, entries);
        Ok(())
    }
}

/// Whether the `managedFields` item `item` was recorded in `api_version` (one without an
/// `apiVersion` is taken to be).
fn item_in_version(item: &Value, api_version: &str) -> bool {
    match item.get("apiVersion").and_then(Value::as_str) {
        None | Some("") => true,
        Some(v) => v == api_version,
    }
}

/// The versions other than `api_version` that `obj`'s `managedFields` were recorded in.
pub fn versions_besides(obj: &Value, api_version: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let items = obj
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array);
    for item in items.into_iter().flatten() {
        if item_in_version(item, api_version) {
            continue;
        }
        if let Some(v) = item.get("apiVersion").and_then(Value::as_str) {
            if !out.iter().any(|o| o == v) {
                out.push(v.to_string());
            }
        }
    }
    out
}

/// [`record_update`] of a write through `res`'s version, `old` and `new` as that version shows
/// the object: as upstream keys an `Update` entry by its version too, only the entries
/// recorded in it are judged and the writer's is the one of that version; entries of other
/// versions are kept as they are, for [`settle_update`] to judge in theirs. A body whose
/// `managedFields` differ from those read replaces them all, as in [`record_update`].
pub fn record_update_in_version(
    res: &ResourceDef,
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    subresource: Option<&str>,
    now: &str,
) {
    let version = res.api_version();
    let read = old
        .and_then(|o| o.pointer("/metadata/managedFields"))
        .cloned();
    // Only a valid list that differs from the one read is the client's (a null or invalid
    // one is ignored, as in `record_update`).
    let supplied = matches!(entries_of(new), Ok(Some(_)))
        && new.pointer("/metadata/managedFields") != read.as_ref();
    let (here, others): (Vec<Value>, Vec<Value>) = match &read {
        Some(Value::Array(items)) => items
            .iter()
            .cloned()
            .partition(|i| item_in_version(i, &version)),
        _ => (Vec::new(), Vec::new()),
    };
    let old = old.map(|o| {
        let mut o = o.clone();
        set_items(&mut o, here.clone());
        o
    });
    if !supplied {
        set_items(new, here);
    }
    record_update(res, old.as_ref(), new, manager, subresource, now);
    if !supplied && !others.is_empty() {
        let mut items = match new.pointer("/metadata/managedFields") {
            Some(Value::Array(items)) => items.clone(),
            _ => Vec::new(),
        };
        items.extend(others);
        set_items(new, items);
    }
}

/// Upstream's rule for an `Update` and the managers that recorded their fields in
/// `api_version`, with the object before (`live`) and after (`new`) as that version shows
/// them: the fields the write changed are taken from them and those it removed are nobody's.
/// Updates `merged`'s entries.
pub fn settle_update(
    res: &ResourceDef,
    merged: &mut Value,
    api_version: &str,
    live: &Value,
    new: &Value,
    subresource: Option<&str>,
) {
    let written = SeenIn {
        live,
        new,
        subresource,
    };
    // Forced, an update meets no conflict; an Update is keyed by its version too, so no
    // entry of another version is the writer's own.
    let _ = written.settle(res, merged, api_version, true, |_| false);
}

/// The 409 for apply conflicts, worded as Kubernetes words it.
fn conflict_error(
    res: &ResourceDef,
    live: &Value,
    entries: &[Entry],
    conflicts: &[(usize, Vec<String>)],
) -> ApiError {
    let causes: Vec<Cause> = conflicts
        .iter()
        .map(|(i, path)| {
            let e = &entries[*i];
            Cause::new(
                "FieldManagerConflict",
                fieldset::display(path),
                format!("conflict with {:?} using {}", e.manager, e.api_version),
            )
        })
        .collect();
    let message = if let [(i, path)] = conflicts {
        let e = &entries[*i];
        format!(
            "Apply failed with 1 conflict: conflict with {:?} using {}: {}",
            e.manager,
            e.api_version,
            fieldset::display(path)
        )
    } else {
        // Grouped by manager, in the order the managers were first met.
        let mut groups: Vec<(usize, Vec<String>)> = Vec::new();
        for (i, path) in conflicts {
            match groups.iter_mut().find(|(g, _)| g == i) {
                Some((_, paths)) => paths.push(fieldset::display(path)),
                None => groups.push((*i, vec![fieldset::display(path)])),
            }
        }
        let parts: Vec<String> = groups
            .iter()
            .map(|(i, paths)| {
                let e = &entries[*i];
                format!(
                    "conflicts with {:?} using {}:\n- {}",
                    e.manager,
                    e.api_version,
                    paths.join("\n- ")
                )
            })
            .collect();
        format!(
            "Apply failed with {} conflicts: {}",
            conflicts.len(),
            parts.join("\n")
        )
    };
    let mut err = ApiError::new(409, "Conflict", message);
    err.details = Some(Box::new(setpoint_api::status::Details {
        name: meta::name(live).to_string(),
        group: res.group.clone(),
        kind: res.plural.clone(),
        causes,
        ..Default::default()
    }));
    err
}

/// Keeps `cur`'s `managedFields` in `new` when nothing else differs and the entries differ only
/// in their timestamps, so a write that changes nothing stays a no-op.
pub fn keep_times_if_unchanged(cur: &Value, new: &mut Value) {
    if !meta::eq_ignoring_meta(cur, new, &["managedFields", "resourceVersion"]) {
        return;
    }
    let untimed = |v: &Value| {
        entries_of(v).ok().flatten().map(|es| {
            es.into_iter()
                .map(|mut e| {
                    e.time = None;
                    e
                })
                .collect::<Vec<_>>()
        })
    };
    if untimed(cur) == untimed(new) {
        match cur.pointer("/metadata/managedFields") {
            Some(mf) => meta::set_meta(new, "managedFields", mf.clone()),
            None => meta::remove_meta(new, "managedFields"),
        }
    }
}

/// Checks the options of a PATCH: apply needs a field manager, and only apply may force.
pub fn check_patch_options(
    is_apply: bool,
    manager: Option<&str>,
    force: bool,
) -> Result<(), ApiError> {
    let cause = if is_apply && manager.is_none_or(str::is_empty) {
        Cause::required("fieldManager", "is required for apply patch")
    } else if !is_apply && force {
        Cause::new(
            "FieldValueForbidden",
            "force",
            "Forbidden: may not be specified for non-apply patch",
        )
    } else {
        return Ok(());
    };
    Err(ApiError::invalid(
        "meta.k8s.io",
        "PatchOptions",
        "",
        vec![cause],
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn def(plural: &str) -> Arc<ResourceDef> {
        crate::registry::Registry::builtin()
            .get("", "v1", plural)
            .expect("built in")
            .clone()
    }

    use std::sync::Arc;

    /// Records `steps` (manager, subresource, new object) one after another, with and without
    /// the shortcut, and checks both give the same `managedFields` after every step.
    fn same_both_ways(res: &ResourceDef, steps: &[(&str, Option<&str>, Value)]) -> Value {
        let (mut fast, mut full): (Option<Value>, Option<Value>) = (None, None);
        for (i, (manager, sub, obj)) in steps.iter().enumerate() {
            let now = format!("2026-01-01T00:00:{i:02}Z");
            let mut a = obj.clone();
            let mut b = obj.clone();
            // Each step's body carries the managedFields it was read with, as clients send.
            if let Some(prev) = &fast {
                meta::set_meta(
                    &mut a,
                    "managedFields",
                    prev["metadata"]["managedFields"].clone(),
                );
                meta::set_meta(
                    &mut b,
                    "managedFields",
                    full.as_ref().unwrap()["metadata"]["managedFields"].clone(),
                );
            }
            record(res, fast.as_ref(), &mut a, manager, *sub, &now, true);
            record(res, full.as_ref(), &mut b, manager, *sub, &now, false);
            assert_eq!(
                serde_json::to_string(&a["metadata"]).unwrap(),
                serde_json::to_string(&b["metadata"]).unwrap(),
                "step {i}"
            );
            fast = Some(a);
            full = Some(b);
        }
        fast.unwrap()
    }

    fn pod(labels: Value, image: &str, status: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "n", "labels": labels},
            "spec": {"containers": [{"name": "app", "image": image}]},
            "status": status})
    }

    #[test]
    fn a_pods_life_records_the_same_either_way() {
        let res = def("pods");
        let running = json!({"phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}]});
        let out = same_both_ways(
            &res,
            &[
                (
                    "controller",
                    None,
                    pod(json!({"app": "web"}), "nginx:1", json!({})),
                ),
                (
                    "node",
                    Some("status"),
                    pod(json!({"app": "web"}), "nginx:1", running.clone()),
                ),
                (
                    "node",
                    Some("status"),
                    pod(
                        json!({"app": "web"}),
                        "nginx:1",
                        json!({"phase": "Running"}),
                    ),
                ),
                // Another manager takes a label over, then the image; the first gives up its own.
                (
                    "kubectl",
                    None,
                    pod(json!({"app": "api"}), "nginx:1", json!({})),
                ),
                (
                    "kubectl",
                    None,
                    pod(json!({"app": "api", "x": "1"}), "nginx:2", json!({})),
                ),
                (
                    "controller",
                    None,
                    pod(json!({"x": "1"}), "nginx:2", json!({})),
                ),
                // A write that changes nothing.
                (
                    "controller",
                    None,
                    pod(json!({"x": "1"}), "nginx:2", json!({})),
                ),
            ],
        );
        let managers: Vec<&str> = out["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["manager"].as_str().unwrap())
            .collect();
        assert_eq!(managers, ["controller", "node", "kubectl"], "{out}");
    }

    #[test]
    fn malformed_stored_entries_fall_back_to_the_full_computation() {
        let res = def("configmaps");
        // A write of `data` over `old`, with and without the shortcut, gives the same.
        let same_either_way = |old: &Value, data: Value| {
            let mut new = json!({"metadata": {"name": "c"}, "data": data});
            meta::set_meta(
                &mut new,
                "managedFields",
                old["metadata"]["managedFields"].clone(),
            );
            let mut full = new.clone();
            record(&res, Some(old), &mut new, "b", None, "t", true);
            record(&res, Some(old), &mut full, "b", None, "t", false);
            assert_eq!(new, full);
        };
        let mut old = json!({"metadata": {"name": "c", "managedFields": [
            {"manager": "a", "operation": "Update", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:data": {"f:k": "not an object"}}}]}, "data": {"k": "1"}});
        same_either_way(&old, json!({"k": "2"}));
        // An operation no entry can have, likewise.
        old["metadata"]["managedFields"][0]["operation"] = json!("Teleport");
        old["metadata"]["managedFields"][0]["fieldsV1"] = json!({"f:data": {}});
        same_either_way(&old, json!({"k": "3"}));
    }

    #[test]
    fn an_update_is_recorded_in_its_version_and_settled_in_the_others() {
        let res = def("configmaps");
        let entries = json!([
            {"manager": "me", "operation": "Update", "apiVersion": "x/v2",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:k": {}}}},
            {"manager": "other", "operation": "Update", "apiVersion": "x/v2",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:a": {}, "f:j": {}}}}]);
        let old = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "managedFields": entries},
            "data": {"k": "1", "a": "1"}});
        // The body carries the entries read: they are the server's to keep.
        let mut new = old.clone();
        new["data"]["a"] = json!("2");
        assert_eq!(super::versions_besides(&old, "v1"), ["x/v2"]);
        super::record_update_in_version(&res, Some(&old), &mut new, "me", None, "t");
        let items = new["metadata"]["managedFields"].as_array().unwrap().clone();
        let summary: Vec<(&Value, &Value, &Value)> = items
            .iter()
            .map(|e| (&e["manager"], &e["apiVersion"], &e["fieldsV1"]))
            .collect();
        // A manager's Update in another version is another entry, and `data.a` as v1 shows
        // it says nothing of x/v2's paths: the x/v2 entries are left for that version.
        assert_eq!(
            summary,
            [
                (&json!("me"), &json!("v1"), &json!({"f:data": {"f:a": {}}})),
                (
                    &json!("me"),
                    &json!("x/v2"),
                    &json!({"f:data": {"f:k": {}}})
                ),
                (
                    &json!("other"),
                    &json!("x/v2"),
                    &json!({"f:data": {"f:a": {}, "f:j": {}}})
                ),
            ],
            "{new}"
        );
        // As x/v2 shows it, the write changed `k` and removed `j`: taken from every x/v2
        // entry, the writer's own of that version included; an entry left empty goes.
        let live = json!({"data": {"k": "1", "a": "1", "j": "1"}});
        let updated = json!({"data": {"k": "2", "a": "1"}});
        super::settle_update(&res, &mut new, "x/v2", &live, &updated, None);
        let left: Vec<(&Value, &Value)> = new["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (&e["manager"], &e["fieldsV1"]))
            .collect();
        assert_eq!(
            left,
            [
                (&json!("me"), &json!({"f:data": {"f:a": {}}})),
                (&json!("other"), &json!({"f:data": {"f:a": {}}})),
            ],
            "{new}"
        );
        // A client's own list replaces them all, as for any update.
        let mut rewritten = old.clone();
        rewritten["metadata"]["managedFields"] = json!([
            {"manager": "x", "operation": "Update", "apiVersion": "v1",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:k": {}}}}]);
        super::record_update_in_version(&res, Some(&old), &mut rewritten, "me", None, "t");
        assert_eq!(
            rewritten["metadata"]["managedFields"]
                .as_array()
                .unwrap()
                .len(),
            1,
            "{rewritten}"
        );
    }

    #[test]
    fn managers_of_another_version_are_judged_as_it_shows_the_object() {
        let res = def("configmaps");
        let config = json!({"metadata": {"name": "c"}, "data": {"k": "2"}});
        let apply = |force| Apply {
            manager: "me",
            config: &config,
            subresource: None,
            force,
            versioned: true,
        };
        // `other` wrote `data.k` in x/v2; the entries' paths in v1 say nothing about it.
        let merged = json!({"metadata": {"name": "c", "managedFields": [
            {"manager": "me", "operation": "Apply", "apiVersion": "v1", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:data": {"f:k": {}}}},
            {"manager": "other", "operation": "Update", "apiVersion": "x/v2",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:k": {}, "f:gone": {}}}}]},
            "data": {"k": "2"}});
        assert_eq!(apply(false).other_versions(&res, &merged), ["x/v2"]);
        let live = json!({"data": {"k": "1", "gone": "x"}});
        let applied = json!({"data": {"k": "2"}});
        let err = apply(false)
            .settle_version(&res, &mut merged.clone(), "x/v2", &live, &applied)
            .unwrap_err();
        assert_eq!(
            err.message,
            r#"Apply failed with 1 conflict: conflict with "other" using x/v2: .data.k"#
        );
        let mut forced = merged.clone();
        apply(true)
            .settle_version(&res, &mut forced, "x/v2", &live, &applied)
            .unwrap();
        // Forced: the changed field is taken from them, the removed one is nobody's, and
        // the entry, left empty, goes.
        let managers: Vec<&Value> = forced["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| &e["manager"])
            .collect();
        assert_eq!(managers, [&json!("me")], "{forced}");
    }

    fn data_map() -> impl Strategy<Value = Value> {
        proptest::collection::btree_map("[abc]", "[xy]", 0..4)
            .prop_map(|m| serde_json::to_value(m).unwrap())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn any_sequence_of_updates_records_the_same_either_way(
            steps in proptest::collection::vec(
                (0..3usize, data_map(), data_map(), proptest::option::of(data_map())),
                1..8,
            )
        ) {
            let res = def("configmaps");
            let managers = ["a", "b", "c"];
            let steps: Vec<(&str, Option<&str>, Value)> = steps
                .into_iter()
                .map(|(m, data, labels, annotations)| {
                    let mut obj = json!({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": "c", "labels": labels}, "data": data});
                    if let Some(a) = annotations {
                        obj["metadata"]["annotations"] = a;
                    }
                    (managers[m], None, obj)
                })
                .collect();
            same_both_ways(&res, &steps);
        }
    }
}
