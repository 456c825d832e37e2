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
    fn special_messages_are_not_object_types() {
        assert!(TypeRef::by_name("k8s.io.apimachinery.pkg.api.resource.Quantity").is_none());
        assert!(TypeRef::by_name("k8s.io.api.core.v1.NoSuchThing").is_none());
    }
}
