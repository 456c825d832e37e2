//! The shape of the generated schema table (`schema.rs`).

/// One protobuf message of the Kubernetes API.
pub(crate) struct Message {
    /// Fully qualified proto name, e.g. `k8s.io.api.apps.v1.DeploymentSpec` (used in errors).
    pub name: &'static str,
    /// Messages whose JSON form is not "an object of its fields".
    pub special: Special,
    /// Sorted by tag.
    pub fields: &'static [Field],
}

/// One field of a message.
pub(crate) struct Field {
    pub tag: u32,
    /// JSON property name (empty for [`Card::Inline`] fields).
    pub json: &'static str,
    pub ty: Ty,
    pub card: Card,
    pub presence: Presence,
}

/// Element type of a field (for maps: the value type; map keys are always strings).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ty {
    Str,
    Bytes,
    Bool,
    I32,
    I64,
    F64,
    /// Index into [`crate::schema::MESSAGES`].
    M(u16),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Card {
    Single,
    Repeated,
    /// `map<string, T>`: repeated entry messages with key = 1, value = 2.
    Map,
    /// A Go struct embedded with `json:",inline"`: its properties are merged into the parent.
    Inline,
}

/// When a scalar field that is on the wire appears in the JSON output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Presence {
    /// Required property (no `omitempty`): always emitted, zero values included.
    Always,
    /// Go pointer (or unknown): emitted whenever it is on the wire, even when zero.
    IfSet,
    /// Go non-pointer with `omitempty`: Go encoders always write it, Go's JSON omits the zero value.
    NonZero,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Special {
    None,
    /// `resource.Quantity`: string field 1 → JSON string.
    Quantity,
    /// `intstr.IntOrString`: type 1 (0 = int, 1 = string), intVal 2, strVal 3.
    IntOrString,
    /// `meta.v1.Time`: seconds 1, nanos 2 → RFC 3339 with second precision, `null` when zero.
    Time,
    /// `meta.v1.MicroTime`: like `Time` with six fractional digits.
    MicroTime,
    /// `meta.v1.Duration`: int64 nanoseconds → Go duration string (`1h0m0s`).
    Duration,
    /// `runtime.RawExtension`, `meta.v1.FieldsV1`, apiextensions `JSON`: raw bytes 1 are JSON.
    RawJson,
    /// A Go slice type wrapped in a message (`ExtraValue`, `Verbs`): repeated field 1 → array.
    ListWrapper,
    /// apiextensions `JSONSchemaPropsOrArray`: schema 1 or array 2.
    OrArray,
    /// apiextensions `JSONSchemaPropsOrBool`: allows 1 or schema 2.
    OrBool,
    /// apiextensions `JSONSchemaPropsOrStringArray`: schema 1 or property 2.
    OrStringArray,
}

/// A top-level kind and the message that encodes it.
pub(crate) struct Kind {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub message: u16,
}

/// Constructor used by the generated table (keeps `schema.rs` compact).
pub(crate) const fn f(
    tag: u32,
    json: &'static str,
    ty: Ty,
    card: Card,
    presence: Presence,
) -> Field {
    Field {
        tag,
        json,
        ty,
        card,
        presence,
    }
}
