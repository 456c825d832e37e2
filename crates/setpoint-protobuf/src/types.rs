//! Read-only navigation of the Kubernetes API type graph.
//!
//! The generated schema table (`schema.rs`) knows, for every message of the Kubernetes API, each
//! field's JSON name, element type and cardinality. The decoder walks it by protobuf tag; this
//! module exposes the same table by JSON name, for code that works on the JSON form of objects
//! (strategic merge patch, OpenAPI output). Nothing is copied: a [`TypeRef`] is an index into the
//! table and a [`FieldRef`] borrows one of its rows.
//!
//! Embedded Go structs (`json:",inline"`, e.g. `Volume`'s `VolumeSource`, `EphemeralContainer`'s
//! `EphemeralContainerCommon`) are resolved transparently: their properties are looked up and
//! listed as if they were declared by the embedding message, exactly as they appear in JSON.
//! [`FieldRef::owner`] still names the message that declares the field, which is where its patch
//! metadata is keyed.
//!
//! ```
//! use setpoint_protobuf::types::{self, Elem};
//!
//! let deployment = types::for_kind("apps", "v1", "Deployment").unwrap();
//! let spec = deployment.field("spec").unwrap().message().unwrap();
//! let template = spec.field("template").unwrap().message().unwrap();
//! let pod_spec = template.field("spec").unwrap().message().unwrap();
//! let containers = pod_spec.field("containers").unwrap();
//! assert!(containers.is_list());
//! assert_eq!(containers.patch_strategy().merge_key(), Some("name"));
//! let Elem::Message(container) = containers.element() else { panic!() };
//! assert_eq!(container.name(), "k8s.io.api.core.v1.Container");
//! ```

use std::fmt;

use crate::docs::{FIELD_DOCS, LIST_TYPES, MESSAGE_DOCS, REQUIRED};
pub use crate::patchmeta::PatchStrategy;
use crate::schema::{KINDS, MESSAGES};
use crate::table::{Card, Field, Message, Special, Ty};

/// Inline (embedded) structs never nest deeply in the Kubernetes API; the bound only guards
/// against a malformed table looping.
const MAX_INLINE_DEPTH: usize = 8;

/// The message type of a top-level kind, e.g. `("apps", "v1", "Deployment")`; the core group is
/// `""`. `None` for kinds the table does not describe (custom resources among them).
pub fn for_kind(group: &str, version: &str, kind: &str) -> Option<TypeRef> {
    KINDS
        .binary_search_by(|k| (k.group, k.version, k.kind).cmp(&(group, version, kind)))
        .ok()
        .map(|i| TypeRef(KINDS[i].message))
}

/// Every top-level kind the table describes, as `(group, version, kind, type)`, sorted.
pub fn kinds() -> impl Iterator<Item = (&'static str, &'static str, &'static str, TypeRef)> {
    KINDS
        .iter()
        .map(|k| (k.group, k.version, k.kind, TypeRef(k.message)))
}

/// The description of any message by its fully qualified protobuf name, including those with a
/// hand-written JSON form (`k8s.io.apimachinery.pkg.api.resource.Quantity`). Empty when the
/// message has no doc comment; `None` for unknown names.
pub fn description_of(name: &str) -> Option<&'static str> {
    MESSAGES
        .iter()
        .position(|m| m.name == name)
        .and_then(|i| MESSAGE_DOCS.get(i).copied())
}

/// The JSON form of a field's value (of each item for lists, of each value for maps).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// An object with typed properties.
    Object(TypeRef),
    /// A string (protobuf `string`).
    String,
    /// base64-encoded `bytes`.
    Bytes,
    /// A boolean (protobuf `bool`).
    Boolean,
    /// An integer of protobuf type `int32` (OpenAPI format `int32`).
    Int32,
    /// An integer of protobuf type `int64` (OpenAPI format `int64`), a JSON number, not the
    /// string protobuf's own JSON mapping would write.
    Int64,
    /// A number of protobuf type `double` (OpenAPI format `double`).
    Double,
    /// `resource.Quantity`: a string such as `500m` (a number is accepted too).
    Quantity,
    /// `intstr.IntOrString`: an integer or a string.
    IntOrString,
    /// `meta.v1.Time`: an RFC 3339 date-time string.
    Time,
    /// `meta.v1.MicroTime`: an RFC 3339 date-time string with microseconds.
    MicroTime,
    /// `meta.v1.Duration`: a Go duration string.
    Duration,
    /// Embedded JSON: `RawExtension`, `FieldsV1` and apiextensions `JSON`.
    RawJson,
    /// A Go slice wrapped in a message (`ExtraValue`): an array of strings.
    StringList,
    /// apiextensions `JSONSchemaPropsOrArray`, `…OrBool`, `…OrStringArray`: a union.
    SchemaUnion,
}

/// One message of the Kubernetes API whose JSON form is an object of its fields.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TypeRef(u16);

impl TypeRef {
    /// Looks a message up by its fully qualified protobuf name, e.g.
    /// `k8s.io.api.core.v1.PodSpec`. Messages with a hand-written JSON form (`Quantity`, `Time`,
    /// `IntOrString`, `RawExtension`, …) are not object types and give `None`.
    pub fn by_name(name: &str) -> Option<TypeRef> {
        MESSAGES
            .iter()
            .position(|m| m.name == name)
            .and_then(|i| u16::try_from(i).ok())
            .filter(|&i| MESSAGES[usize::from(i)].special == Special::None)
            .map(TypeRef)
    }

    fn message(self) -> &'static Message {
        &MESSAGES[usize::from(self.0)]
    }

    /// The fully qualified protobuf name, e.g. `k8s.io.api.apps.v1.DeploymentSpec`.
    pub fn name(self) -> &'static str {
        self.message().name
    }

    /// The last segment of the name, the Go type name: `DeploymentSpec`.
    pub fn short_name(self) -> &'static str {
        let name = self.name();
        name.rsplit('.').next().unwrap_or(name)
    }

    /// The description of the type (its Go doc comment), empty when it has none.
    pub fn description(self) -> &'static str {
        MESSAGE_DOCS.get(usize::from(self.0)).copied().unwrap_or("")
    }

    /// The JSON properties Kubernetes' OpenAPI lists as required, embedded structs included.
    pub fn required(self) -> Vec<&'static str> {
        let mut owners = vec![self.0];
        let mut out: Vec<&'static str> = Vec::new();
        let mut seen = 0;
        while seen < owners.len() && seen <= MAX_INLINE_DEPTH {
            let index = owners[seen];
            seen += 1;
            out.extend(REQUIRED.get(usize::from(index)).copied().unwrap_or(&[]));
            for f in MESSAGES[usize::from(index)].fields {
                if let (Card::Inline, Ty::M(inner)) = (f.card, f.ty) {
                    owners.push(inner);
                }
            }
        }
        out
    }

    /// The property `json_name` of this type's JSON form, looking through embedded structs.
    pub fn field(self, json_name: &str) -> Option<FieldRef> {
        find_field(self.0, json_name, 0)
    }

    /// Every property of this type's JSON form, embedded structs flattened in place, in the
    /// table's (protobuf tag) order.
    pub fn fields(self) -> impl Iterator<Item = FieldRef> {
        let mut out = Vec::new();
        collect_fields(self.0, &mut out, 0);
        out.into_iter()
    }
}

impl fmt::Debug for TypeRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TypeRef({})", self.name())
    }
}

fn find_field(index: u16, json_name: &str, depth: usize) -> Option<FieldRef> {
    if depth > MAX_INLINE_DEPTH || json_name.is_empty() {
        return None;
    }
    let msg = &MESSAGES[usize::from(index)];
    if let Some(field) = msg.fields.iter().find(|f| f.json == json_name) {
        return Some(FieldRef {
            owner: index,
            field,
        });
    }
    msg.fields
        .iter()
        .filter(|f| f.card == Card::Inline)
        .find_map(|f| match f.ty {
            Ty::M(inner) => find_field(inner, json_name, depth + 1),
            _ => None,
        })
}

fn collect_fields(index: u16, out: &mut Vec<FieldRef>, depth: usize) {
    if depth > MAX_INLINE_DEPTH {
        return;
    }
    for field in MESSAGES[usize::from(index)].fields {
        match (field.card, field.ty) {
            (Card::Inline, Ty::M(inner)) => collect_fields(inner, out, depth + 1),
            (Card::Inline, _) => {}
            _ => out.push(FieldRef {
                owner: index,
                field,
            }),
        }
    }
}

/// What a field holds (for lists: each item; for maps: each value; map keys are strings).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    /// An object with typed properties.
    Message(TypeRef),
    /// A JSON scalar: string, number, boolean, or a type with a scalar JSON form (`Quantity`,
    /// `IntOrString`, `Time`, `MicroTime`, `Duration`, base64 `bytes`).
    Scalar,
    /// Arbitrary JSON the schema does not describe: `RawExtension`, apiextensions `JSON`,
    /// `FieldsV1`, the `JSONSchemaPropsOr*` unions and string-list wrappers such as
    /// `ExtraValue`.
    Json,
}

/// One property of a type's JSON form.
#[derive(Clone, Copy)]
pub struct FieldRef {
    /// The message that declares the field (an embedded struct for inline properties).
    owner: u16,
    field: &'static Field,
}

impl FieldRef {
    /// The JSON property name.
    pub fn name(self) -> &'static str {
        self.field.json
    }

    /// The message that declares this field: the embedded struct for properties that come from
    /// an inline field, else the type it was looked up on.
    pub fn owner(self) -> TypeRef {
        TypeRef(self.owner)
    }

    /// A JSON array (a `repeated` field that is not a map).
    pub fn is_list(self) -> bool {
        self.field.card == Card::Repeated
    }

    /// A JSON object with free string keys (`map<string, T>`: labels, annotations, resource
    /// lists, `data`).
    pub fn is_map(self) -> bool {
        self.field.card == Card::Map
    }

    /// The type of the value, of each list item, or of each map value.
    pub fn element(self) -> Elem {
        elem_of(self.field.ty)
    }

    /// The element type when it is a message (for a single field: the field's own type).
    pub fn message(self) -> Option<TypeRef> {
        match self.element() {
            Elem::Message(t) => Some(t),
            _ => None,
        }
    }

    /// The JSON form of the value (of each item, of each map value), with scalar formats and the
    /// special hand-written forms told apart.
    pub fn form(self) -> Form {
        match self.field.ty {
            Ty::Str => Form::String,
            Ty::Bytes => Form::Bytes,
            Ty::Bool => Form::Boolean,
            Ty::I32 => Form::Int32,
            Ty::I64 => Form::Int64,
            Ty::F64 => Form::Double,
            Ty::M(index) => match MESSAGES[usize::from(index)].special {
                Special::None => Form::Object(TypeRef(index)),
                Special::Quantity => Form::Quantity,
                Special::IntOrString => Form::IntOrString,
                Special::Time => Form::Time,
                Special::MicroTime => Form::MicroTime,
                Special::Duration => Form::Duration,
                Special::RawJson => Form::RawJson,
                Special::ListWrapper => Form::StringList,
                Special::OrArray | Special::OrBool | Special::OrStringArray => Form::SchemaUnion,
            },
        }
    }

    /// The fully qualified protobuf name of the value's message type (special forms included),
    /// `None` for protobuf scalars.
    pub fn type_name(self) -> Option<&'static str> {
        match self.field.ty {
            Ty::M(index) => Some(MESSAGES[usize::from(index)].name),
            _ => None,
        }
    }

    fn position(self) -> Option<usize> {
        MESSAGES[usize::from(self.owner)]
            .fields
            .iter()
            .position(|f| std::ptr::eq(f, self.field))
    }

    /// The field's description (its Go doc comment), empty when it has none.
    pub fn description(self) -> &'static str {
        self.position()
            .and_then(|i| FIELD_DOCS.get(usize::from(self.owner))?.get(i).copied())
            .unwrap_or("")
    }

    /// The list's `+listType` marker (`atomic`, `set` or `map`) and, for `map`, its
    /// `+listMapKey`s; `None` when Kubernetes declares none.
    pub fn list_type(self) -> Option<(&'static str, &'static [&'static str])> {
        let pos = u16::try_from(self.position()?).ok()?;
        LIST_TYPES
            .binary_search_by(|(m, f, _, _)| (*m, *f).cmp(&(self.owner, pos)))
            .ok()
            .map(|i| (LIST_TYPES[i].2, LIST_TYPES[i].3))
    }

    /// Whether Kubernetes' OpenAPI lists the property as required.
    pub fn is_required(self) -> bool {
        REQUIRED
            .get(usize::from(self.owner))
            .is_some_and(|r| r.contains(&self.name()))
    }

    /// The strategic-merge-patch strategy Kubernetes declares for this field
    /// (`patchStrategy`/`patchMergeKey` struct tags), [`PatchStrategy::Default`] when none.
    pub fn patch_strategy(self) -> PatchStrategy {
        crate::patchmeta::lookup(self.owner().name(), self.name())
    }
}

impl fmt::Debug for FieldRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FieldRef({}.{})", self.owner().name(), self.name())
    }
}

fn elem_of(ty: Ty) -> Elem {
    match ty {
        Ty::Str | Ty::Bytes | Ty::Bool | Ty::I32 | Ty::I64 | Ty::F64 => Elem::Scalar,
        Ty::M(index) => match MESSAGES[usize::from(index)].special {
            Special::None => Elem::Message(TypeRef(index)),
            Special::Quantity
            | Special::IntOrString
            | Special::Time
            | Special::MicroTime
            | Special::Duration => Elem::Scalar,
            Special::RawJson
            | Special::ListWrapper
            | Special::OrArray
            | Special::OrBool
            | Special::OrStringArray => Elem::Json,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ty(name: &str) -> TypeRef {
        TypeRef::by_name(name).unwrap_or_else(|| panic!("{name} not in the table"))
    }

    #[test]
    fn kinds_resolve_to_their_messages() {
        assert_eq!(
            for_kind("apps", "v1", "Deployment").unwrap().name(),
            "k8s.io.api.apps.v1.Deployment"
        );
        assert_eq!(for_kind("", "v1", "Pod").unwrap().short_name(), "Pod");
        assert_eq!(
            for_kind("autoscaling", "v1", "Scale").unwrap().name(),
            "k8s.io.api.autoscaling.v1.Scale"
        );
        assert!(for_kind("example.com", "v1", "Widget").is_none());
        // The options wildcard used for decoding is not a kind of every group.
        assert!(for_kind("example.com", "v1", "DeleteOptions").is_none());
    }

    #[test]
    fn fields_report_cardinality_and_element() {
        let pod_spec = ty("k8s.io.api.core.v1.PodSpec");
        let containers = pod_spec.field("containers").unwrap();
        assert!(containers.is_list() && !containers.is_map());
        assert_eq!(
            containers.message().unwrap().name(),
            "k8s.io.api.core.v1.Container"
        );
        let node_selector = pod_spec.field("nodeSelector").unwrap();
        assert!(node_selector.is_map());
        assert_eq!(node_selector.element(), Elem::Scalar);
        let meta = ty("k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta");
        assert_eq!(
            meta.field("creationTimestamp").unwrap().element(),
            Elem::Scalar
        );
        assert_eq!(meta.field("finalizers").unwrap().element(), Elem::Scalar);
        let limits = ty("k8s.io.api.core.v1.ResourceRequirements")
            .field("limits")
            .unwrap();
        assert!(limits.is_map());
        assert_eq!(limits.element(), Elem::Scalar);
        let raw = ty("k8s.io.api.apps.v1.ControllerRevision")
            .field("data")
            .unwrap();
        assert_eq!(raw.element(), Elem::Json);
        assert!(pod_spec.field("noSuchField").is_none());
        assert!(pod_spec.field("").is_none());
    }

    #[test]
    fn inline_fields_are_transparent() {
        let volume = ty("k8s.io.api.core.v1.Volume");
        let cm = volume.field("configMap").unwrap();
        assert_eq!(cm.owner().name(), "k8s.io.api.core.v1.VolumeSource");
        assert_eq!(volume.field("name").unwrap().owner(), volume);
        let names: Vec<_> = volume.fields().map(|f| f.name()).collect();
        assert!(names.contains(&"name") && names.contains(&"emptyDir"));
        assert!(!names.contains(&""));

        let eph = ty("k8s.io.api.core.v1.EphemeralContainer");
        let env = eph.field("env").unwrap();
        assert_eq!(
            env.owner().name(),
            "k8s.io.api.core.v1.EphemeralContainerCommon"
        );
        assert_eq!(env.patch_strategy().merge_key(), Some("name"));
        assert!(eph.field("targetContainerName").is_some());
    }

    #[test]
    fn descriptions_forms_and_required() {
        let ru = ty("k8s.io.api.apps.v1.RollingUpdateDeployment");
        assert!(ru
            .description()
            .starts_with("Spec to control the desired behavior"));
        let surge = ru.field("maxSurge").unwrap();
        assert_eq!(surge.form(), Form::IntOrString);
        assert!(surge
            .description()
            .starts_with("The maximum number of pods"));
        let container = ty("k8s.io.api.core.v1.Container");
        assert!(container.field("name").unwrap().is_required());
        assert!(!container.field("image").unwrap().is_required());
        assert!(!container
            .field("image")
            .unwrap()
            .description()
            .contains("+optional"));
        assert_eq!(container.required(), vec!["name"]);
        assert_eq!(
            container.field("ports").unwrap().list_type(),
            Some(("map", &["containerPort", "protocol"][..]))
        );
        assert_eq!(container.field("image").unwrap().list_type(), None);
        assert_eq!(
            ty("k8s.io.api.core.v1.PodSpec")
                .field("containers")
                .unwrap()
                .form(),
            Form::Object(container)
        );
        assert_eq!(
            ty("k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta")
                .field("creationTimestamp")
                .unwrap()
                .form(),
            Form::Time
        );
        assert!(
            description_of("k8s.io.apimachinery.pkg.util.intstr.IntOrString")
                .unwrap()
                .contains("int32 or a string")
        );
        assert!(
            kinds().any(|(g, v, k, t)| (g, v, k) == ("apps", "v1", "Deployment")
                && t.name() == "k8s.io.api.apps.v1.Deployment")
        );
    }

    #[test]
    fn special_messages_are_not_object_types() {
        assert!(TypeRef::by_name("k8s.io.apimachinery.pkg.api.resource.Quantity").is_none());
        assert!(TypeRef::by_name("k8s.io.api.core.v1.NoSuchThing").is_none());
    }
}
