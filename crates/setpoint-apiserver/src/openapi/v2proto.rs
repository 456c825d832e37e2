//! The Swagger 2.0 document in gnostic's protobuf form (`openapi.v2.Document` of gnostic's
//! `openapiv2/OpenAPIv2.proto`), which kube-apiserver serves for
//! `Accept: application/com.github.proto-openapi.spec.v2[@.]v1.0+protobuf` and client-go's
//! `OpenAPISchema()` asks for.
//!
//! The messages are written by hand with `prost` derives instead of generated from the
//! `.proto`: the server only ever encodes the subset of Swagger 2.0 its own JSON document uses,
//! so only those messages and fields are declared — with gnostic's field numbers, which is all
//! the wire format depends on. Fields left out (security, tags, external docs, XML, file
//! schemas, headers, examples) are simply absent, as they are in the JSON. Having real structs
//! also lets tests decode what was encoded.
//!
//! As gnostic does, vendor extensions (`x-…`), `default`, `example` and `enum` values are
//! [`Any`] messages carrying the YAML text of the value (readers such as kubectl parse that
//! YAML); the `google.protobuf.Any` field is never set. Keys Swagger 2.0 has no field for (an
//! `anyOf` left in a custom resource's schema, `nullable`) cannot be represented and are
//! dropped.
//!
//! Each message names the gnostic message it mirrors, and each field is the Swagger 2.0 field
//! of the same name (in snake case), whose meaning is the specification's; the fields carry no
//! doc comments of their own.
#![allow(missing_docs)]

use serde_json::{Map, Value};

/// `openapi.v2.Document`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Document {
    #[prost(string, tag = "1")]
    pub swagger: String,
    #[prost(message, optional, tag = "2")]
    pub info: Option<Info>,
    #[prost(string, tag = "3")]
    pub host: String,
    #[prost(string, tag = "4")]
    pub base_path: String,
    #[prost(string, repeated, tag = "5")]
    pub schemes: Vec<String>,
    #[prost(string, repeated, tag = "6")]
    pub consumes: Vec<String>,
    #[prost(string, repeated, tag = "7")]
    pub produces: Vec<String>,
    #[prost(message, optional, tag = "8")]
    pub paths: Option<Paths>,
    #[prost(message, optional, tag = "9")]
    pub definitions: Option<Definitions>,
    #[prost(message, repeated, tag = "16")]
    pub vendor_extension: Vec<NamedAny>,
}

/// `openapi.v2.Info`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Info {
    #[prost(string, tag = "1")]
    pub title: String,
    #[prost(string, tag = "2")]
    pub version: String,
    #[prost(string, tag = "3")]
    pub description: String,
    #[prost(string, tag = "4")]
    pub terms_of_service: String,
    #[prost(message, optional, tag = "5")]
    pub contact: Option<Contact>,
    #[prost(message, optional, tag = "6")]
    pub license: Option<License>,
    #[prost(message, repeated, tag = "7")]
    pub vendor_extension: Vec<NamedAny>,
}

/// `openapi.v2.Contact`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Contact {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub url: String,
    #[prost(string, tag = "3")]
    pub email: String,
    #[prost(message, repeated, tag = "4")]
    pub vendor_extension: Vec<NamedAny>,
}

/// `openapi.v2.License`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct License {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub url: String,
    #[prost(message, repeated, tag = "3")]
    pub vendor_extension: Vec<NamedAny>,
}

/// `openapi.v2.Any`: a value as YAML text (field 1, a `google.protobuf.Any`, is never used).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Any {
    #[prost(string, tag = "2")]
    pub yaml: String,
}

/// `openapi.v2.NamedAny`: one entry of a map of [`Any`] (vendor extensions).
#[derive(Clone, PartialEq, prost::Message)]
pub struct NamedAny {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<Any>,
}

/// `openapi.v2.Paths`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Paths {
    #[prost(message, repeated, tag = "1")]
    pub vendor_extension: Vec<NamedAny>,
    #[prost(message, repeated, tag = "2")]
    pub path: Vec<NamedPathItem>,
}

/// `openapi.v2.NamedPathItem`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NamedPathItem {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<PathItem>,
}

/// `openapi.v2.PathItem`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PathItem {
    /// `$ref`.
    #[prost(string, tag = "1")]
    pub xref: String,
    #[prost(message, optional, tag = "2")]
    pub get: Option<Operation>,
    #[prost(message, optional, tag = "3")]
    pub put: Option<Operation>,
    #[prost(message, optional, tag = "4")]
    pub post: Option<Operation>,
    #[prost(message, optional, tag = "5")]
    pub delete: Option<Operation>,
    #[prost(message, optional, tag = "6")]
    pub options: Option<Operation>,
    #[prost(message, optional, tag = "7")]
    pub head: Option<Operation>,
    #[prost(message, optional, tag = "8")]
    pub patch: Option<Operation>,
    #[prost(message, repeated, tag = "9")]
    pub parameters: Vec<ParametersItem>,
    #[prost(message, repeated, tag = "10")]
    pub vendor_extension: Vec<NamedAny>,
}

/// `openapi.v2.Operation`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Operation {
    #[prost(string, repeated, tag = "1")]
    pub tags: Vec<String>,
    #[prost(string, tag = "2")]
    pub summary: String,
    #[prost(string, tag = "3")]
    pub description: String,
    #[prost(string, tag = "5")]
    pub operation_id: String,
    #[prost(string, repeated, tag = "6")]
    pub produces: Vec<String>,
    #[prost(string, repeated, tag = "7")]
    pub consumes: Vec<String>,
    #[prost(message, repeated, tag = "8")]
    pub parameters: Vec<ParametersItem>,
    #[prost(message, optional, tag = "9")]
    pub responses: Option<Responses>,
    #[prost(string, repeated, tag = "10")]
    pub schemes: Vec<String>,
    #[prost(bool, tag = "11")]
    pub deprecated: bool,
    #[prost(message, repeated, tag = "13")]
    pub vendor_extension: Vec<NamedAny>,
}

/// `openapi.v2.ParametersItem`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ParametersItem {
    #[prost(oneof = "parameters_item::Oneof", tags = "1, 2")]
    pub oneof: Option<parameters_item::Oneof>,
}

pub mod parameters_item {
    // A reference is the rare alternative, and each value is built once per document:
    // boxing the common one would only cost an allocation each.
    #[allow(clippy::large_enum_variant)]
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Oneof {
        #[prost(message, tag = "1")]
        Parameter(super::Parameter),
        #[prost(message, tag = "2")]
        JsonReference(super::JsonReference),
    }
}

/// `openapi.v2.JsonReference`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct JsonReference {
    /// `$ref`.
    #[prost(string, tag = "1")]
    pub xref: String,
    #[prost(string, tag = "2")]
    pub description: String,
}

/// `openapi.v2.Parameter`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Parameter {
    #[prost(oneof = "parameter::Oneof", tags = "1, 2")]
    pub oneof: Option<parameter::Oneof>,
}

pub mod parameter {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Oneof {
        #[prost(message, tag = "1")]
        BodyParameter(super::BodyParameter),
        #[prost(message, tag = "2")]
        NonBodyParameter(super::NonBodyParameter),
    }
}

/// `openapi.v2.BodyParameter`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct BodyParameter {
    #[prost(string, tag = "1")]
    pub description: String,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(string, tag = "3")]
    pub r#in: String,
    #[prost(bool, tag = "4")]
    pub required: bool,
    #[prost(message, optional, tag = "5")]
    pub schema: Option<Schema>,
    #[prost(message, repeated, tag = "6")]
    pub vendor_extension: Vec<NamedAny>,
}

/// `openapi.v2.NonBodyParameter`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NonBodyParameter {
    #[prost(oneof = "non_body_parameter::Oneof", tags = "1, 2, 3, 4")]
    pub oneof: Option<non_body_parameter::Oneof>,
}

pub mod non_body_parameter {
    /// gnostic has four sub-schema messages; header and path parameters share one field
    /// layout ([`PathParameterSubSchema`](super::PathParameterSubSchema)), query and form-data
    /// parameters the other ([`QueryParameterSubSchema`](super::QueryParameterSubSchema),
    /// which adds `allowEmptyValue`), so two structs cover all four.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Oneof {
        #[prost(message, tag = "1")]
        HeaderParameterSubSchema(super::PathParameterSubSchema),
        #[prost(message, tag = "2")]
        FormDataParameterSubSchema(super::QueryParameterSubSchema),
        #[prost(message, tag = "3")]
        QueryParameterSubSchema(super::QueryParameterSubSchema),
        #[prost(message, tag = "4")]
        PathParameterSubSchema(super::PathParameterSubSchema),
    }
}

/// `openapi.v2.QueryParameterSubSchema` (and `FormDataParameterSubSchema`, the same layout).
#[derive(Clone, PartialEq, prost::Message)]
pub struct QueryParameterSubSchema {
    #[prost(bool, tag = "1")]
    pub required: bool,
    #[prost(string, tag = "2")]
    pub r#in: String,
    #[prost(string, tag = "3")]
    pub description: String,
    #[prost(string, tag = "4")]
    pub name: String,
    #[prost(bool, tag = "5")]
    pub allow_empty_value: bool,
    #[prost(string, tag = "6")]
    pub r#type: String,
    #[prost(string, tag = "7")]
    pub format: String,
    #[prost(message, optional, tag = "8")]
    pub items: Option<PrimitivesItems>,
    #[prost(string, tag = "9")]
    pub collection_format: String,
    #[prost(message, optional, tag = "10")]
    pub default: Option<Any>,
    #[prost(string, tag = "17")]
    pub pattern: String,
    #[prost(bool, tag = "20")]
    pub unique_items: bool,
    #[prost(message, repeated, tag = "21")]
    pub r#enum: Vec<Any>,
    #[prost(message, repeated, tag = "23")]
    pub vendor_extension: Vec<NamedAny>,
}

/// `openapi.v2.PathParameterSubSchema` (and `HeaderParameterSubSchema`, the same layout).
#[derive(Clone, PartialEq, prost::Message)]
pub struct PathParameterSubSchema {
    #[prost(bool, tag = "1")]
    pub required: bool,
    #[prost(string, tag = "2")]
    pub r#in: String,
    #[prost(string, tag = "3")]
    pub description: String,
    #[prost(string, tag = "4")]
    pub name: String,
    #[prost(string, tag = "5")]
    pub r#type: String,
    #[prost(string, tag = "6")]
    pub format: String,
    #[prost(message, optional, tag = "7")]
    pub items: Option<PrimitivesItems>,
    #[prost(string, tag = "8")]
    pub collection_format: String,
    #[prost(message, optional, tag = "9")]
    pub default: Option<Any>,
    #[prost(string, tag = "16")]
    pub pattern: String,
    #[prost(bool, tag = "19")]
    pub unique_items: bool,
    #[prost(message, repeated, tag = "20")]
    pub r#enum: Vec<Any>,
    #[prost(message, repeated, tag = "22")]
    pub vendor_extension: Vec<NamedAny>,
}

/// `openapi.v2.PrimitivesItems`: the items of an array parameter.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PrimitivesItems {
    #[prost(string, tag = "1")]
    pub r#type: String,
    #[prost(string, tag = "2")]
    pub format: String,
    #[prost(message, optional, boxed, tag = "3")]
    pub items: Option<Box<PrimitivesItems>>,
    #[prost(string, tag = "4")]
    pub collection_format: String,
    #[prost(message, optional, tag = "5")]
    pub default: Option<Any>,
    #[prost(message, repeated, tag = "18")]
    pub vendor_extension: Vec<NamedAny>,
}

/// `openapi.v2.Responses`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Responses {
    #[prost(message, repeated, tag = "1")]
    pub response_code: Vec<NamedResponseValue>,
    #[prost(message, repeated, tag = "2")]
    pub vendor_extension: Vec<NamedAny>,
}

/// `openapi.v2.NamedResponseValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NamedResponseValue {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<ResponseValue>,
}

/// `openapi.v2.ResponseValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResponseValue {
    #[prost(oneof = "response_value::Oneof", tags = "1, 2")]
    pub oneof: Option<response_value::Oneof>,
}

pub mod response_value {
    // A reference is the rare alternative, and each value is built once per document:
    // boxing the common one would only cost an allocation each.
    #[allow(clippy::large_enum_variant)]
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Oneof {
        #[prost(message, tag = "1")]
        Response(super::Response),
        #[prost(message, tag = "2")]
        JsonReference(super::JsonReference),
    }
}

/// `openapi.v2.Response`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Response {
    #[prost(string, tag = "1")]
    pub description: String,
    #[prost(message, optional, tag = "2")]
    pub schema: Option<SchemaItem>,
    #[prost(message, repeated, tag = "5")]
    pub vendor_extension: Vec<NamedAny>,
}

/// `openapi.v2.SchemaItem` (only its `schema` alternative; `file_schema` is never produced).
#[derive(Clone, PartialEq, prost::Message)]
pub struct SchemaItem {
    #[prost(message, optional, tag = "1")]
    pub schema: Option<Schema>,
}

/// `openapi.v2.Definitions`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Definitions {
    #[prost(message, repeated, tag = "1")]
    pub additional_properties: Vec<NamedSchema>,
}

/// `openapi.v2.Properties`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Properties {
    #[prost(message, repeated, tag = "1")]
    pub additional_properties: Vec<NamedSchema>,
}

/// `openapi.v2.NamedSchema`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NamedSchema {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<Schema>,
}

/// `openapi.v2.TypeItem`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeItem {
    #[prost(string, repeated, tag = "1")]
    pub value: Vec<String>,
}

/// `openapi.v2.ItemsItem`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ItemsItem {
    #[prost(message, repeated, tag = "1")]
    pub schema: Vec<Schema>,
}

/// `openapi.v2.AdditionalPropertiesItem`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AdditionalPropertiesItem {
    #[prost(oneof = "additional_properties_item::Oneof", tags = "1, 2")]
    pub oneof: Option<additional_properties_item::Oneof>,
}

pub mod additional_properties_item {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Oneof {
        /// Boxed: a schema contains its additional-properties schema.
        #[prost(message, boxed, tag = "1")]
        Schema(Box<super::Schema>),
        #[prost(bool, tag = "2")]
        Boolean(bool),
    }
}

/// `openapi.v2.Schema`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Schema {
    /// `$ref`.
    #[prost(string, tag = "1")]
    pub xref: String,
    #[prost(string, tag = "2")]
    pub format: String,
    #[prost(string, tag = "3")]
    pub title: String,
    #[prost(string, tag = "4")]
    pub description: String,
    #[prost(message, optional, tag = "5")]
    pub default: Option<Any>,
    #[prost(double, tag = "6")]
    pub multiple_of: f64,
    #[prost(double, tag = "7")]
    pub maximum: f64,
    #[prost(bool, tag = "8")]
    pub exclusive_maximum: bool,
    #[prost(double, tag = "9")]
    pub minimum: f64,
    #[prost(bool, tag = "10")]
    pub exclusive_minimum: bool,
    #[prost(int64, tag = "11")]
    pub max_length: i64,
    #[prost(int64, tag = "12")]
    pub min_length: i64,
    #[prost(string, tag = "13")]
    pub pattern: String,
    #[prost(int64, tag = "14")]
    pub max_items: i64,
    #[prost(int64, tag = "15")]
    pub min_items: i64,
    #[prost(bool, tag = "16")]
    pub unique_items: bool,
    #[prost(int64, tag = "17")]
    pub max_properties: i64,
    #[prost(int64, tag = "18")]
    pub min_properties: i64,
    #[prost(string, repeated, tag = "19")]
    pub required: Vec<String>,
    #[prost(message, repeated, tag = "20")]
    pub r#enum: Vec<Any>,
    #[prost(message, optional, tag = "21")]
    pub additional_properties: Option<AdditionalPropertiesItem>,
    #[prost(message, optional, tag = "22")]
    pub r#type: Option<TypeItem>,
    #[prost(message, optional, tag = "23")]
    pub items: Option<ItemsItem>,
    #[prost(message, repeated, tag = "24")]
    pub all_of: Vec<Schema>,
    #[prost(message, optional, tag = "25")]
    pub properties: Option<Properties>,
    #[prost(string, tag = "26")]
    pub discriminator: String,
    #[prost(bool, tag = "27")]
    pub read_only: bool,
    #[prost(message, optional, tag = "30")]
    pub example: Option<Any>,
    #[prost(message, repeated, tag = "31")]
    pub vendor_extension: Vec<NamedAny>,
}

/// Encodes a Swagger 2.0 JSON document as a gnostic `openapi.v2.Document`.
pub fn encode(doc: &Value) -> Vec<u8> {
    prost::Message::encode_to_vec(&document(doc))
}

/// Converts a Swagger 2.0 JSON document into the gnostic message.
pub fn document(doc: &Value) -> Document {
    let info = doc.get("info").and_then(Value::as_object).map(|m| Info {
        title: text(m, "title"),
        version: text(m, "version"),
        description: text(m, "description"),
        terms_of_service: text(m, "termsOfService"),
        contact: m
            .get("contact")
            .and_then(Value::as_object)
            .map(|c| Contact {
                name: text(c, "name"),
                url: text(c, "url"),
                email: text(c, "email"),
                vendor_extension: extensions(c),
            }),
        license: m
            .get("license")
            .and_then(Value::as_object)
            .map(|l| License {
                name: text(l, "name"),
                url: text(l, "url"),
                vendor_extension: extensions(l),
            }),
        vendor_extension: extensions(m),
    });
    let paths = doc.get("paths").and_then(Value::as_object).map(|m| Paths {
        vendor_extension: extensions(m),
        path: m
            .iter()
            .filter(|(k, _)| !k.starts_with("x-"))
            .map(|(name, item)| NamedPathItem {
                name: name.clone(),
                value: item.as_object().map(path_item),
            })
            .collect(),
    });
    let definitions = doc
        .get("definitions")
        .and_then(Value::as_object)
        .map(|m| Definitions {
            additional_properties: named_schemas(m),
        });
    let empty = Map::new();
    let top = doc.as_object().unwrap_or(&empty);
    Document {
        swagger: text(top, "swagger"),
        info,
        host: text(top, "host"),
        base_path: text(top, "basePath"),
        schemes: strings(top.get("schemes")),
        consumes: strings(top.get("consumes")),
        produces: strings(top.get("produces")),
        paths,
        definitions,
        vendor_extension: extensions(top),
    }
}

fn text(m: &Map<String, Value>, key: &str) -> String {
    m.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

fn flag(m: &Map<String, Value>, key: &str) -> bool {
    m.get(key).and_then(Value::as_bool).unwrap_or(false)
}

fn int(m: &Map<String, Value>, key: &str) -> i64 {
    m.get(key).and_then(Value::as_i64).unwrap_or(0)
}

fn float(m: &Map<String, Value>, key: &str) -> f64 {
    m.get(key).and_then(Value::as_f64).unwrap_or(0.0)
}

/// A string or a list of strings (`type` may be either).
fn strings(v: Option<&Value>) -> Vec<String> {
    match v {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        _ => Vec::new(),
    }
}

/// The value as gnostic carries it: YAML text.
fn any(v: &Value) -> Any {
    // JSON is YAML too, so should the YAML writer ever refuse a value the JSON text still
    // says the same thing to a YAML reader.
    let yaml = serde_saphyr::to_string(v).unwrap_or_else(|_| v.to_string());
    Any { yaml }
}

fn any_of(m: &Map<String, Value>, key: &str) -> Option<Any> {
    m.get(key).map(any)
}

fn anys(m: &Map<String, Value>, key: &str) -> Vec<Any> {
    m.get(key)
        .and_then(Value::as_array)
        .map(|a| a.iter().map(any).collect())
        .unwrap_or_default()
}

/// The object's `x-…` keys, in order.
fn extensions(m: &Map<String, Value>) -> Vec<NamedAny> {
    m.iter()
        .filter(|(k, _)| k.starts_with("x-"))
        .map(|(k, v)| NamedAny {
            name: k.clone(),
            value: Some(any(v)),
        })
        .collect()
}

fn named_schemas(m: &Map<String, Value>) -> Vec<NamedSchema> {
    m.iter()
        .map(|(name, s)| NamedSchema {
            name: name.clone(),
            value: Some(schema(s)),
        })
        .collect()
}

fn schema(v: &Value) -> Schema {
    let empty = Map::new();
    let m = v.as_object().unwrap_or(&empty);
    let types = strings(m.get("type"));
    Schema {
        xref: text(m, "$ref"),
        format: text(m, "format"),
        title: text(m, "title"),
        description: text(m, "description"),
        default: any_of(m, "default"),
        multiple_of: float(m, "multipleOf"),
        maximum: float(m, "maximum"),
        exclusive_maximum: flag(m, "exclusiveMaximum"),
        minimum: float(m, "minimum"),
        exclusive_minimum: flag(m, "exclusiveMinimum"),
        max_length: int(m, "maxLength"),
        min_length: int(m, "minLength"),
        pattern: text(m, "pattern"),
        max_items: int(m, "maxItems"),
        min_items: int(m, "minItems"),
        unique_items: flag(m, "uniqueItems"),
        max_properties: int(m, "maxProperties"),
        min_properties: int(m, "minProperties"),
        required: strings(m.get("required")),
        r#enum: anys(m, "enum"),
        additional_properties: m.get("additionalProperties").and_then(|a| {
            let oneof = match a {
                Value::Bool(b) => additional_properties_item::Oneof::Boolean(*b),
                Value::Object(_) => additional_properties_item::Oneof::Schema(Box::new(schema(a))),
                _ => return None,
            };
            Some(AdditionalPropertiesItem { oneof: Some(oneof) })
        }),
        r#type: (!types.is_empty()).then_some(TypeItem { value: types }),
        items: m.get("items").and_then(|i| match i {
            Value::Object(_) => Some(ItemsItem {
                schema: vec![schema(i)],
            }),
            Value::Array(a) => Some(ItemsItem {
                schema: a.iter().map(schema).collect(),
            }),
            _ => None,
        }),
        all_of: m
            .get("allOf")
            .and_then(Value::as_array)
            .map(|a| a.iter().map(schema).collect())
            .unwrap_or_default(),
        properties: m
            .get("properties")
            .and_then(Value::as_object)
            .map(|p| Properties {
                additional_properties: named_schemas(p),
            }),
        discriminator: text(m, "discriminator"),
        read_only: flag(m, "readOnly"),
        example: any_of(m, "example"),
        vendor_extension: extensions(m),
    }
}

fn path_item(m: &Map<String, Value>) -> PathItem {
    let op = |method: &str| m.get(method).and_then(Value::as_object).map(operation);
    PathItem {
        xref: text(m, "$ref"),
        get: op("get"),
        put: op("put"),
        post: op("post"),
        delete: op("delete"),
        options: op("options"),
        head: op("head"),
        patch: op("patch"),
        parameters: parameters(m.get("parameters")),
        vendor_extension: extensions(m),
    }
}

fn operation(m: &Map<String, Value>) -> Operation {
    Operation {
        tags: strings(m.get("tags")),
        summary: text(m, "summary"),
        description: text(m, "description"),
        operation_id: text(m, "operationId"),
        produces: strings(m.get("produces")),
        consumes: strings(m.get("consumes")),
        parameters: parameters(m.get("parameters")),
        responses: m.get("responses").and_then(Value::as_object).map(responses),
        schemes: strings(m.get("schemes")),
        deprecated: flag(m, "deprecated"),
        vendor_extension: extensions(m),
    }
}

fn parameters(v: Option<&Value>) -> Vec<ParametersItem> {
    v.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object)
        .map(|p| ParametersItem {
            oneof: Some(parameter_item(p)),
        })
        .collect()
}

fn parameter_item(p: &Map<String, Value>) -> parameters_item::Oneof {
    if let Some(r) = p.get("$ref").and_then(Value::as_str) {
        return parameters_item::Oneof::JsonReference(JsonReference {
            xref: r.to_string(),
            description: text(p, "description"),
        });
    }
    let location = text(p, "in");
    let oneof = if location == "body" {
        parameter::Oneof::BodyParameter(BodyParameter {
            description: text(p, "description"),
            name: text(p, "name"),
            r#in: location,
            required: flag(p, "required"),
            schema: p.get("schema").map(schema),
            vendor_extension: extensions(p),
        })
    } else {
        let query_like = || QueryParameterSubSchema {
            required: flag(p, "required"),
            r#in: location.clone(),
            description: text(p, "description"),
            name: text(p, "name"),
            allow_empty_value: flag(p, "allowEmptyValue"),
            r#type: text(p, "type"),
            format: text(p, "format"),
            items: p.get("items").and_then(Value::as_object).map(primitives),
            collection_format: text(p, "collectionFormat"),
            default: any_of(p, "default"),
            pattern: text(p, "pattern"),
            unique_items: flag(p, "uniqueItems"),
            r#enum: anys(p, "enum"),
            vendor_extension: extensions(p),
        };
        let path_like = || PathParameterSubSchema {
            required: flag(p, "required"),
            r#in: location.clone(),
            description: text(p, "description"),
            name: text(p, "name"),
            r#type: text(p, "type"),
            format: text(p, "format"),
            items: p.get("items").and_then(Value::as_object).map(primitives),
            collection_format: text(p, "collectionFormat"),
            default: any_of(p, "default"),
            pattern: text(p, "pattern"),
            unique_items: flag(p, "uniqueItems"),
            r#enum: anys(p, "enum"),
            vendor_extension: extensions(p),
        };
        let sub = match location.as_str() {
            "header" => non_body_parameter::Oneof::HeaderParameterSubSchema(path_like()),
            "path" => non_body_parameter::Oneof::PathParameterSubSchema(path_like()),
            "formData" => non_body_parameter::Oneof::FormDataParameterSubSchema(query_like()),
            // `query`, and the best guess for a parameter that names no known location.
            _ => non_body_parameter::Oneof::QueryParameterSubSchema(query_like()),
        };
        parameter::Oneof::NonBodyParameter(NonBodyParameter { oneof: Some(sub) })
    };
    parameters_item::Oneof::Parameter(Parameter { oneof: Some(oneof) })
}

fn primitives(m: &Map<String, Value>) -> PrimitivesItems {
    PrimitivesItems {
        r#type: text(m, "type"),
        format: text(m, "format"),
        items: m
            .get("items")
            .and_then(Value::as_object)
            .map(|i| Box::new(primitives(i))),
        collection_format: text(m, "collectionFormat"),
        default: any_of(m, "default"),
        vendor_extension: extensions(m),
    }
}

fn responses(m: &Map<String, Value>) -> Responses {
    Responses {
        response_code: m
            .iter()
            .filter(|(k, _)| !k.starts_with("x-"))
            .filter_map(|(code, r)| {
                let r = r.as_object()?;
                let oneof = match r.get("$ref").and_then(Value::as_str) {
                    Some(x) => response_value::Oneof::JsonReference(JsonReference {
                        xref: x.to_string(),
                        description: text(r, "description"),
                    }),
                    None => response_value::Oneof::Response(Response {
                        description: text(r, "description"),
                        schema: r.get("schema").map(|s| SchemaItem {
                            schema: Some(schema(s)),
                        }),
                        vendor_extension: extensions(r),
                    }),
                };
                Some(NamedResponseValue {
                    name: code.clone(),
                    value: Some(ResponseValue { oneof: Some(oneof) }),
                })
            })
            .collect(),
        vendor_extension: extensions(m),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use serde_json::json;

    fn sample() -> Value {
        json!({
            "swagger": "2.0",
            "info": {"title": "Kubernetes", "version": "v1.32.0"},
            "paths": {
                "/apis/apps/v1/namespaces/{namespace}/deployments": {
                    "get": {
                        "operationId": "listDeployment",
                        "x-kubernetes-action": "list",
                        "produces": ["application/json"],
                        "responses": {"200": {"description": "OK", "schema": {"$ref": "#/definitions/X"}}},
                    },
                    "post": {
                        "consumes": ["application/json"],
                        "parameters": [
                            {"name": "dryRun", "in": "query", "type": "string", "uniqueItems": true},
                            {"name": "body", "in": "body", "required": true, "schema": {"$ref": "#/definitions/X"}},
                            {"name": "namespace", "in": "path", "required": true, "type": "string"},
                        ],
                    },
                },
                "/api/v1/pods": {"get": {"operationId": "listPod"}},
            },
            "definitions": {
                "X": {
                    "type": "object",
                    "required": ["spec"],
                    "properties": {
                        "spec": {"$ref": "#/definitions/Y", "description": "the spec"},
                        "replicas": {"type": "integer", "format": "int32", "default": 1, "minimum": 0},
                        "ports": {
                            "type": "array",
                            "items": {"$ref": "#/definitions/Port"},
                            "x-kubernetes-list-type": "map",
                            "x-kubernetes-list-map-keys": ["containerPort", "protocol"],
                            "x-kubernetes-patch-strategy": "merge,retainKeys",
                        },
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "mode": {"type": "string", "enum": ["A", "true"]},
                        "anything": {"type": "object", "additionalProperties": true},
                    },
                    "x-kubernetes-group-version-kind": [{"group": "apps", "version": "v1", "kind": "X"}],
                },
            },
        })
    }

    /// Parses an `Any`'s YAML back into JSON.
    fn yaml(a: &Option<Any>) -> Value {
        let text = &a.as_ref().expect("value").yaml;
        serde_saphyr::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"))
    }

    fn prop<'a>(s: &'a Schema, name: &str) -> &'a Schema {
        s.properties
            .as_ref()
            .and_then(|p| p.additional_properties.iter().find(|n| n.name == name))
            .and_then(|n| n.value.as_ref())
            .unwrap_or_else(|| panic!("no property {name}"))
    }

    fn types(s: &Schema) -> Vec<&str> {
        s.r#type
            .iter()
            .flat_map(|t| &t.value)
            .map(String::as_str)
            .collect()
    }

    #[test]
    fn round_trip_keeps_paths_schemas_and_extensions() {
        let bytes = encode(&sample());
        let doc = Document::decode(bytes.as_slice()).expect("decodes");
        assert_eq!(doc.swagger, "2.0");
        assert_eq!(doc.info.as_ref().unwrap().title, "Kubernetes");

        let paths = &doc.paths.as_ref().unwrap().path;
        assert_eq!(paths.len(), 2);
        let deployments = paths
            .iter()
            .find(|p| p.name == "/apis/apps/v1/namespaces/{namespace}/deployments")
            .and_then(|p| p.value.as_ref())
            .unwrap();
        let get = deployments.get.as_ref().unwrap();
        assert_eq!(get.operation_id, "listDeployment");
        assert_eq!(get.vendor_extension[0].name, "x-kubernetes-action");
        assert_eq!(yaml(&get.vendor_extension[0].value), json!("list"));
        let ok = &get.responses.as_ref().unwrap().response_code[0];
        assert_eq!(ok.name, "200");
        match ok.value.as_ref().and_then(|v| v.oneof.as_ref()) {
            Some(response_value::Oneof::Response(r)) => {
                assert_eq!(r.description, "OK");
                let s = r.schema.as_ref().and_then(|s| s.schema.as_ref()).unwrap();
                assert_eq!(s.xref, "#/definitions/X");
            }
            other => panic!("{other:?}"),
        }
        let params: Vec<&parameter::Oneof> = deployments
            .post
            .as_ref()
            .unwrap()
            .parameters
            .iter()
            .map(|p| match &p.oneof {
                Some(parameters_item::Oneof::Parameter(Parameter { oneof: Some(o) })) => o,
                other => panic!("{other:?}"),
            })
            .collect();
        match params.as_slice() {
            [parameter::Oneof::NonBodyParameter(NonBodyParameter {
                oneof: Some(non_body_parameter::Oneof::QueryParameterSubSchema(q)),
            }), parameter::Oneof::BodyParameter(b), parameter::Oneof::NonBodyParameter(NonBodyParameter {
                oneof: Some(non_body_parameter::Oneof::PathParameterSubSchema(p)),
            })] => {
                assert_eq!((q.name.as_str(), q.r#type.as_str()), ("dryRun", "string"));
                assert!(q.unique_items);
                assert!(b.required);
                assert_eq!(b.schema.as_ref().unwrap().xref, "#/definitions/X");
                assert_eq!((p.name.as_str(), p.required), ("namespace", true));
            }
            other => panic!("{other:?}"),
        }

        let defs = &doc.definitions.as_ref().unwrap().additional_properties;
        assert_eq!(defs.len(), 1);
        let x = defs[0].value.as_ref().unwrap();
        assert_eq!(defs[0].name, "X");
        assert_eq!(types(x), ["object"]);
        assert_eq!(x.required, ["spec"]);
        let spec = prop(x, "spec");
        assert_eq!(
            (spec.xref.as_str(), spec.description.as_str()),
            ("#/definitions/Y", "the spec")
        );
        let replicas = prop(x, "replicas");
        assert_eq!(types(replicas), ["integer"]);
        assert_eq!(replicas.format, "int32");
        assert_eq!(yaml(&replicas.default), json!(1));
        let ports = prop(x, "ports");
        assert_eq!(types(ports), ["array"]);
        assert_eq!(
            ports.items.as_ref().unwrap().schema[0].xref,
            "#/definitions/Port"
        );
        let ext: Vec<(&str, Value)> = ports
            .vendor_extension
            .iter()
            .map(|e| (e.name.as_str(), yaml(&e.value)))
            .collect();
        assert!(ext.contains(&("x-kubernetes-list-type", json!("map"))));
        assert!(ext.contains(&(
            "x-kubernetes-list-map-keys",
            json!(["containerPort", "protocol"])
        )));
        assert!(ext.contains(&("x-kubernetes-patch-strategy", json!("merge,retainKeys"))));
        match prop(x, "labels")
            .additional_properties
            .as_ref()
            .and_then(|a| a.oneof.as_ref())
        {
            Some(additional_properties_item::Oneof::Schema(s)) => {
                assert_eq!(types(s), ["string"])
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            prop(x, "anything")
                .additional_properties
                .as_ref()
                .and_then(|a| a.oneof.clone()),
            Some(additional_properties_item::Oneof::Boolean(true))
        );
        // A string that reads as a boolean in YAML must stay a string.
        let modes: Vec<Value> = prop(x, "mode")
            .r#enum
            .iter()
            .map(|a| yaml(&Some(a.clone())))
            .collect();
        assert_eq!(modes, [json!("A"), json!("true")]);
        let gvk = &x.vendor_extension[0];
        assert_eq!(gvk.name, "x-kubernetes-group-version-kind");
        assert_eq!(
            yaml(&gvk.value),
            json!([{"group": "apps", "version": "v1", "kind": "X"}])
        );
    }

    #[test]
    fn field_numbers_are_gnostics() {
        // Document.swagger is field 1, Document.definitions field 9 and NamedSchema.name
        // field 1: a wrong tag would change these bytes even where decoding with the same
        // structs could not notice.
        let bytes = encode(&json!({"swagger": "2.0", "definitions": {"A": {}}}));
        assert_eq!(
            bytes,
            [0x0a, 3, b'2', b'.', b'0', 0x4a, 7, 0x0a, 5, 0x0a, 1, b'A', 0x12, 0]
        );
    }
}
