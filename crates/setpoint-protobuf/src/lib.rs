//! Decodes Kubernetes protobuf request bodies (`Content-Type: application/vnd.kubernetes.protobuf`)
//! of built-in kinds into the JSON the client would have sent.
//!
//! kubectl and every client-go "typed client" send protobuf for built-in kinds (`kubectl create
//! deployment|namespace|configmap|secret|job|…`, `autoscale`, `create token`, `drain`, `auth
//! can-i`). Setpoint answers JSON, so it only needs to *decode*.
//!
//! # Wire format
//! The body is the 4 magic bytes `k8s\0` followed by a `runtime.Unknown` message: field 1
//! `typeMeta {1: apiVersion, 2: kind}`, field 2 the raw bytes of the typed object (its message
//! from k8s.io/api `generated.proto`), field 3 `contentEncoding`, field 4 `contentType`.
//!
//! # How decoding works
//! A generic wire-format decoder walks the object's bytes, driven by a schema table
//! (`src/schema.rs`, generated) that lists, for every message of the Kubernetes API,
//! each field's tag, JSON name, type and cardinality. Messages whose JSON form is hand-written in
//! Go are mapped by hand: `Quantity` (string), `IntOrString` (number or string), `Time` and
//! `MicroTime` (RFC 3339, `null` for the zero time), `Duration` (`"1h0m0s"`), `RawExtension` /
//! `FieldsV1` / apiextensions `JSON` (embedded JSON), the apiextensions `JSONSchemaPropsOr*`
//! unions and slice wrappers such as `ExtraValue`. `bytes` become base64 strings, maps become
//! objects, embedded Go structs (`json:",inline"`, e.g. `Probe.ProbeHandler`,
//! `Volume.VolumeSource`) are flattened into their parent.
//!
//! Go's protobuf encoders write every non-pointer field, zero values included, while Go's JSON
//! encoder drops zero values of `omitempty` fields. The table therefore records, per scalar field,
//! whether it is required (always emitted), a Go pointer (emitted whenever present, so
//! `replicas: 0` survives) or a non-pointer `omitempty` field (omitted when zero). Absent fields
//! are omitted, empty repeated fields are omitted, a present empty message is `{}`.
//!
//! # The type graph
//! The same table, navigated by JSON name rather than by tag, is public as [`types`]: a
//! read-only view of every message's properties (embedded structs flattened), their
//! cardinality and element types. [`patchmeta`] holds, next to it, the strategic-merge-patch
//! strategies and merge keys Kubernetes declares in its struct tags; the API server's strategic
//! merge patch and OpenAPI output both read them from there.
//!
//! # Regenerating the schema
//! `src/schema.rs` is generated and committed. After bumping `k8s-pb` or `k8s-openapi` (both are
//! dev-dependencies of this crate), run from anywhere:
//!
//! ```text
//! python3 crates/setpoint-protobuf/gen/gen_schema.py            # add --verbose to list fallbacks
//! ```
//!
//! The generator finds both crates' sources with `cargo metadata` (or `--k8s-pb DIR`,
//! `--k8s-openapi DIR`), takes messages, tags and types from k8s-pb, exact JSON property names,
//! required properties and the list of kinds from k8s-openapi, and Go pointer-ness from
//! `gen/go-pointer-fields.txt`. The same run writes `src/docs.rs`: every message's and field's
//! description (the Go doc comments k8s-pb carries, `+marker` lines dropped) and the required
//! properties, which [`types`] exposes for the API server's OpenAPI documents.

mod decode;
#[rustfmt::skip]
mod docs;
pub mod patchmeta;
#[rustfmt::skip]
mod schema;
mod table;
mod time;
pub mod types;
mod wire;

use serde_json::{Map, Value};

use crate::table::Kind;
use crate::wire::{Raw, Reader, WireError};

/// The 4 bytes every Kubernetes protobuf body starts with.
pub const MAGIC: &[u8] = b"k8s\0";

const UNKNOWN: &str = "k8s.io.apimachinery.pkg.runtime.Unknown";
const TYPE_META: &str = "k8s.io.apimachinery.pkg.runtime.TypeMeta";

/// Why a body could not be decoded. Every malformed input yields one of these; decoding never
/// panics.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The body does not start with `k8s\0`.
    #[error("not a Kubernetes protobuf body: it does not start with the magic bytes \"k8s\\0\"")]
    BadMagic,
    /// The input ends inside a key or value.
    #[error(
        "truncated protobuf input in message {message}{}",
        .field.map(|f| format!(" (field {f})")).unwrap_or_default()
    )]
    Truncated {
        /// The fully qualified protobuf name of the message being read.
        message: &'static str,
        /// The field number whose value is cut short; `None` when the input ends inside a key.
        field: Option<u32>,
    },
    /// A field has the wrong wire type or an invalid value.
    #[error("malformed field {field} in message {message}: {reason}")]
    MalformedField {
        /// The fully qualified protobuf name of the message the field belongs to.
        message: &'static str,
        /// The protobuf field number.
        field: u32,
        /// What is wrong with the field's value or wire type.
        reason: String,
    },
    /// A message could not be split into fields (invalid key).
    #[error("malformed message {message}: {reason}")]
    MalformedMessage {
        /// The fully qualified protobuf name of the message.
        message: &'static str,
        /// Why its bytes do not split into fields.
        reason: String,
    },
    /// The envelope names a kind this crate has no schema for.
    #[error("unknown kind {kind} in {api_version}: no protobuf schema is known for it")]
    UnknownKind {
        /// The envelope's `typeMeta.apiVersion`.
        api_version: String,
        /// The envelope's `typeMeta.kind`.
        kind: String,
    },
    /// The envelope is well-formed but cannot be handled (no type, compressed, other encoding).
    #[error("unsupported protobuf envelope: {0}")]
    UnsupportedEnvelope(String),
    /// Messages nest deeper than the decoder accepts.
    #[error("protobuf messages nested deeper than {0} levels")]
    TooDeep(usize),
}

/// Decodes a `k8s\0`-enveloped protobuf body into a JSON object that carries `apiVersion` and
/// `kind`, exactly as the object would look had the client sent JSON.
pub fn decode(body: &[u8]) -> Result<Value, DecodeError> {
    decode_at_depth(body, 0)
}

/// Whether a kind is decodable (group, version, kind), e.g. `("apps", "v1", "Deployment")`; the
/// core group is `""`.
pub fn supports(group: &str, version: &str, kind: &str) -> bool {
    find_kind(group, version, kind).is_some()
}

fn find_kind(group: &str, version: &str, kind: &str) -> Option<u16> {
    let kinds: &[Kind] = schema::KINDS;
    if let Ok(i) =
        kinds.binary_search_by(|k| (k.group, k.version, k.kind).cmp(&(group, version, kind)))
    {
        return Some(kinds[i].message);
    }
    schema::WILDCARD_KINDS
        .iter()
        .find(|(k, _)| *k == kind)
        .map(|(_, message)| *message)
}

/// The envelope's fields.
#[derive(Default)]
struct Envelope<'a> {
    api_version: String,
    kind: String,
    raw: &'a [u8],
    content_encoding: String,
    content_type: String,
}

fn envelope_error(message: &'static str, field: Option<u32>, e: WireError) -> DecodeError {
    match (e, field) {
        (WireError::Truncated, field) => DecodeError::Truncated { message, field },
        (WireError::Invalid(reason), Some(field)) => DecodeError::MalformedField {
            message,
            field,
            reason,
        },
        (WireError::Invalid(reason), None) => DecodeError::MalformedMessage { message, reason },
    }
}

/// Reads the string/bytes fields of a small hand-decoded message (the envelope and its TypeMeta).
fn read_len_fields<'a>(
    message: &'static str,
    buf: &'a [u8],
    mut each: impl FnMut(u32, &'a [u8]),
) -> Result<(), DecodeError> {
    let mut reader = Reader::new(buf);
    while !reader.is_empty() {
        let (tag, wt) = reader.key().map_err(|e| envelope_error(message, None, e))?;
        let raw = reader
            .value(wt)
            .map_err(|e| envelope_error(message, Some(tag), e))?;
        match raw {
            Raw::Len(bytes) => each(tag, bytes),
            other if (1..=4).contains(&tag) => {
                return Err(DecodeError::MalformedField {
                    message,
                    field: tag,
                    reason: format!(
                        "{} wire type where length-delimited was expected",
                        wire::wire_type_name(other.wire_type())
                    ),
                })
            }
            _ => {}
        }
    }
    Ok(())
}

fn parse_envelope(buf: &[u8]) -> Result<Envelope<'_>, DecodeError> {
    let mut env = Envelope::default();
    let mut type_meta: Vec<&[u8]> = Vec::new();
    read_len_fields(UNKNOWN, buf, |tag, bytes| match tag {
        1 => type_meta.push(bytes),
        2 => env.raw = bytes,
        3 => env.content_encoding = String::from_utf8_lossy(bytes).into_owned(),
        4 => env.content_type = String::from_utf8_lossy(bytes).into_owned(),
        _ => {}
    })?;
    for tm in type_meta {
        read_len_fields(TYPE_META, tm, |tag, bytes| match tag {
            1 => env.api_version = String::from_utf8_lossy(bytes).into_owned(),
            2 => env.kind = String::from_utf8_lossy(bytes).into_owned(),
            _ => {}
        })?;
    }
    Ok(env)
}

pub(crate) fn decode_at_depth(body: &[u8], depth: usize) -> Result<Value, DecodeError> {
    let Some(rest) = body.strip_prefix(MAGIC) else {
        return Err(DecodeError::BadMagic);
    };
    if depth > decode::MAX_DEPTH {
        return Err(DecodeError::TooDeep(decode::MAX_DEPTH));
    }
    let env = parse_envelope(rest)?;
    if !env.content_encoding.is_empty() {
        return Err(DecodeError::UnsupportedEnvelope(format!(
            "content encoding {:?} is not supported",
            env.content_encoding
        )));
    }
    if env.api_version.is_empty() || env.kind.is_empty() {
        return Err(DecodeError::UnsupportedEnvelope(
            "the envelope does not name the object's apiVersion and kind".into(),
        ));
    }
    let object = match env.content_type.as_str() {
        "" | "application/vnd.kubernetes.protobuf" => {
            let (group, version) = match env.api_version.split_once('/') {
                Some((g, v)) => (g, v),
                None => ("", env.api_version.as_str()),
            };
            let Some(index) = find_kind(group, version, &env.kind) else {
                return Err(DecodeError::UnknownKind {
                    api_version: env.api_version,
                    kind: env.kind,
                });
            };
            decode::decode_message(index, env.raw, depth + 1)?
        }
        "application/json" => {
            serde_json::from_slice(env.raw).map_err(|e| DecodeError::MalformedField {
                message: UNKNOWN,
                field: 2,
                reason: format!("raw bytes declared as JSON are not JSON: {e}"),
            })?
        }
        other => {
            return Err(DecodeError::UnsupportedEnvelope(format!(
                "content type {other:?} of the embedded object is not supported"
            )))
        }
    };
    let mut out = Map::new();
    out.insert("apiVersion".into(), Value::String(env.api_version));
    out.insert("kind".into(), Value::String(env.kind));
    if let Value::Object(fields) = object {
        for (k, v) in fields {
            if k != "apiVersion" && k != "kind" {
                out.insert(k, v);
            }
        }
    }
    Ok(Value::Object(out))
}

#[cfg(test)]
mod tests;
