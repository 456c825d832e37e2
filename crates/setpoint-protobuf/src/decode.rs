//! Schema-driven decoding of one protobuf message into its Kubernetes JSON form.

use base64::Engine as _;
use serde_json::{Map, Number, Value};

use crate::schema::MESSAGES;
use crate::table::{Card, Field, Message, Presence, Special, Ty};
use crate::wire::{wire_type_name, Raw, Reader, WireError, FIXED64, LEN, VARINT};
use crate::DecodeError;

/// Deepest message nesting accepted (real objects stay far below; recursive types such as
/// JSONSchemaProps could otherwise exhaust the stack on hostile input).
pub(crate) const MAX_DEPTH: usize = 100;

/// Seconds of Go's zero `time.Time` (0001-01-01T00:00:00Z) relative to the Unix epoch.
const GO_ZERO_TIME_SECONDS: i64 = -62_135_596_800;

/// What has been read for one field of a message.
enum Slot<'a> {
    Empty,
    /// Singular scalar: the last occurrence wins.
    One(Value),
    /// Repeated field, in wire order.
    Many(Vec<Value>),
    /// Map field: later entries with the same key win.
    Entries(Map<String, Value>),
    /// Singular message: every occurrence, merged as protobuf does (by concatenation).
    Chunks(Vec<&'a [u8]>),
}

pub(crate) fn message(index: u16) -> &'static Message {
    &MESSAGES[usize::from(index)]
}

/// Decodes the bytes of message `index` into JSON.
pub(crate) fn decode_message(index: u16, buf: &[u8], depth: usize) -> Result<Value, DecodeError> {
    if depth > MAX_DEPTH {
        return Err(DecodeError::TooDeep(MAX_DEPTH));
    }
    let msg = message(index);
    let slots = collect(msg, buf, depth)?;
    render(msg, slots, depth)
}

fn collect<'a>(
    msg: &'static Message,
    buf: &'a [u8],
    depth: usize,
) -> Result<Vec<Slot<'a>>, DecodeError> {
    let mut slots: Vec<Slot<'a>> = msg.fields.iter().map(|_| Slot::Empty).collect();
    let mut reader = Reader::new(buf);
    while !reader.is_empty() {
        let (tag, wt) = reader.key().map_err(|e| match e {
            WireError::Truncated => DecodeError::Truncated {
                message: msg.name,
                field: None,
            },
            WireError::Invalid(reason) => DecodeError::MalformedMessage {
                message: msg.name,
                reason,
            },
        })?;
        let raw = reader.value(wt).map_err(|e| wire_error(msg, tag, e))?;
        // Unknown fields are skipped, as protobuf requires (newer servers add fields).
        let Ok(i) = msg.fields.binary_search_by_key(&tag, |f| f.tag) else {
            continue;
        };
        let field = &msg.fields[i];
        accept(field, raw, &mut slots[i], depth).map_err(|e| e.in_field(msg, tag))?;
    }
    Ok(slots)
}

fn wire_error(msg: &'static Message, tag: u32, e: WireError) -> DecodeError {
    match e {
        WireError::Truncated => DecodeError::Truncated {
            message: msg.name,
            field: Some(tag),
        },
        WireError::Invalid(reason) => DecodeError::MalformedField {
            message: msg.name,
            field: tag,
            reason,
        },
    }
}

/// A failure inside one field: either a plain reason (the field context is added by the caller)
/// or an error already located in a nested message.
enum FieldError {
    Reason(String),
    Nested(DecodeError),
}

impl FieldError {
    fn in_field(self, msg: &'static Message, tag: u32) -> DecodeError {
        match self {
            FieldError::Reason(reason) => DecodeError::MalformedField {
                message: msg.name,
                field: tag,
                reason,
            },
            FieldError::Nested(e) => e,
        }
    }
}

impl From<DecodeError> for FieldError {
    fn from(e: DecodeError) -> Self {
        FieldError::Nested(e)
    }
}

fn wrong_wire_type(raw: &Raw<'_>, expected: u8) -> FieldError {
    FieldError::Reason(format!(
        "{} wire type where {} was expected",
        wire_type_name(raw.wire_type()),
        wire_type_name(expected)
    ))
}

fn expected_wire_type(ty: Ty) -> u8 {
    match ty {
        Ty::Bool | Ty::I32 | Ty::I64 => VARINT,
        Ty::F64 => FIXED64,
        Ty::Str | Ty::Bytes | Ty::M(_) => LEN,
    }
}

fn accept<'a>(
    field: &'static Field,
    raw: Raw<'a>,
    slot: &mut Slot<'a>,
    depth: usize,
) -> Result<(), FieldError> {
    match (field.card, field.ty) {
        (Card::Single | Card::Inline, Ty::M(_)) => {
            let Raw::Len(bytes) = raw else {
                return Err(wrong_wire_type(&raw, LEN));
            };
            match slot {
                Slot::Chunks(chunks) => chunks.push(bytes),
                _ => *slot = Slot::Chunks(vec![bytes]),
            }
        }
        (Card::Single | Card::Inline, ty) => *slot = Slot::One(scalar(ty, raw)?),
        (Card::Repeated, ty) => {
            if !matches!(slot, Slot::Many(_)) {
                *slot = Slot::Many(Vec::new());
            }
            let Slot::Many(items) = slot else {
                unreachable!()
            };
            match (ty, raw) {
                (Ty::M(m), Raw::Len(bytes)) => items.push(decode_message(m, bytes, depth + 1)?),
                (Ty::Bool | Ty::I32 | Ty::I64 | Ty::F64, Raw::Len(packed)) => {
                    unpack(ty, packed, items)?
                }
                (ty, raw) => items.push(scalar(ty, raw)?),
            }
        }
        (Card::Map, ty) => {
            let Raw::Len(entry) = raw else {
                return Err(wrong_wire_type(&raw, LEN));
            };
            let (key, value) = map_entry(ty, entry, depth)?;
            if !matches!(slot, Slot::Entries(_)) {
                *slot = Slot::Entries(Map::new());
            }
            let Slot::Entries(entries) = slot else {
                unreachable!()
            };
            entries.insert(key, value);
        }
    }
    Ok(())
}

/// Packed repeated scalars: the values back to back inside one length-delimited field.
fn unpack(ty: Ty, packed: &[u8], items: &mut Vec<Value>) -> Result<(), FieldError> {
    let mut reader = Reader::new(packed);
    let wt = expected_wire_type(ty);
    while !reader.is_empty() {
        let raw = reader.value(wt).map_err(|e| match e {
            WireError::Truncated => FieldError::Reason("truncated packed repeated value".into()),
            WireError::Invalid(reason) => FieldError::Reason(reason),
        })?;
        items.push(scalar(ty, raw)?);
    }
    Ok(())
}

fn scalar(ty: Ty, raw: Raw<'_>) -> Result<Value, FieldError> {
    Ok(match (ty, raw) {
        // Go converts strings without validating them and its JSON encoder replaces invalid
        // UTF-8 with U+FFFD; do the same.
        (Ty::Str, Raw::Len(b)) => Value::String(String::from_utf8_lossy(b).into_owned()),
        (Ty::Bytes, Raw::Len(b)) => {
            Value::String(base64::engine::general_purpose::STANDARD.encode(b))
        }
        (Ty::Bool, Raw::Varint(v)) => Value::Bool(v != 0),
        // int32 is sign-extended to 64 bits on the wire; truncating recovers negative values.
        (Ty::I32, Raw::Varint(v)) => Value::from(v as i32),
        (Ty::I64, Raw::Varint(v)) => Value::from(v as i64),
        (Ty::F64, Raw::Fixed64(bits)) => double(f64::from_bits(bits))?,
        (ty, raw) => return Err(wrong_wire_type(&raw, expected_wire_type(ty))),
    })
}

/// Go's JSON encoder writes integral doubles without a fraction (`1`, not `1.0`).
fn double(x: f64) -> Result<Value, FieldError> {
    if !x.is_finite() {
        return Err(FieldError::Reason(format!(
            "{x} cannot be represented in JSON"
        )));
    }
    if x.fract() == 0.0 && x.abs() < 9_007_199_254_740_992.0 {
        return Ok(Value::from(x as i64));
    }
    Ok(Number::from_f64(x)
        .map(Value::Number)
        .unwrap_or(Value::Null))
}

fn map_entry(ty: Ty, entry: &[u8], depth: usize) -> Result<(String, Value), FieldError> {
    let mut reader = Reader::new(entry);
    let mut key = String::new();
    let mut value: Option<Value> = None;
    let mut chunks: Vec<&[u8]> = Vec::new();
    let located = |e: WireError| match e {
        WireError::Truncated => FieldError::Reason("truncated map entry".into()),
        WireError::Invalid(reason) => FieldError::Reason(format!("map entry: {reason}")),
    };
    while !reader.is_empty() {
        let (tag, wt) = reader.key().map_err(located)?;
        let raw = reader.value(wt).map_err(located)?;
        match (tag, ty, raw) {
            (1, _, Raw::Len(b)) => key = String::from_utf8_lossy(b).into_owned(),
            (1, _, raw) => return Err(wrong_wire_type(&raw, LEN)),
            (2, Ty::M(_), Raw::Len(b)) => chunks.push(b),
            (2, Ty::M(_), raw) => return Err(wrong_wire_type(&raw, LEN)),
            (2, ty, raw) => value = Some(scalar(ty, raw)?),
            _ => {}
        }
    }
    let value = match (ty, value) {
        (Ty::M(m), _) => decode_chunks(m, &chunks, depth)?,
        (_, Some(v)) => v,
        (Ty::Str | Ty::Bytes, None) => Value::String(String::new()),
        (Ty::Bool, None) => Value::Bool(false),
        (_, None) => Value::from(0),
    };
    Ok((key, value))
}

/// Decodes a singular message that may have occurred several times (protobuf merges them, which
/// is the same as decoding the concatenation).
fn decode_chunks(index: u16, chunks: &[&[u8]], depth: usize) -> Result<Value, DecodeError> {
    match chunks {
        [] => decode_message(index, &[], depth + 1),
        [one] => decode_message(index, one, depth + 1),
        many => decode_message(index, &many.concat(), depth + 1),
    }
}

fn is_zero(v: &Value) -> bool {
    match v {
        Value::String(s) => s.is_empty(),
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::Null => true,
        _ => false,
    }
}

fn render(msg: &'static Message, slots: Vec<Slot<'_>>, depth: usize) -> Result<Value, DecodeError> {
    if msg.special != Special::None {
        return render_special(msg, slots, depth);
    }
    let mut obj = Map::new();
    for (field, slot) in msg.fields.iter().zip(slots) {
        match slot {
            Slot::Empty => {}
            Slot::One(v) => {
                if field.presence != Presence::NonZero || !is_zero(&v) {
                    obj.insert(field.json.to_owned(), v);
                }
            }
            Slot::Many(items) => {
                if !items.is_empty() {
                    obj.insert(field.json.to_owned(), Value::Array(items));
                }
            }
            Slot::Entries(entries) => {
                obj.insert(field.json.to_owned(), Value::Object(entries));
            }
            Slot::Chunks(chunks) => {
                let Ty::M(m) = field.ty else { unreachable!() };
                let v = decode_chunks(m, &chunks, depth)?;
                match (field.card, v) {
                    (Card::Inline, Value::Object(inner)) => obj.extend(inner),
                    (Card::Inline, _) => {}
                    (_, v) => {
                        obj.insert(field.json.to_owned(), v);
                    }
                }
            }
        }
    }
    Ok(Value::Object(obj))
}

/// The slots of a special message, looked up by tag.
struct Parts<'a> {
    msg: &'static Message,
    slots: Vec<Slot<'a>>,
    depth: usize,
}

impl<'a> Parts<'a> {
    fn take(&mut self, tag: u32) -> (Option<&'static Field>, Slot<'a>) {
        match self.msg.fields.iter().position(|f| f.tag == tag) {
            Some(i) => (
                Some(&self.msg.fields[i]),
                std::mem::replace(&mut self.slots[i], Slot::Empty),
            ),
            None => (None, Slot::Empty),
        }
    }

    fn scalar(&mut self, tag: u32) -> Option<Value> {
        match self.take(tag).1 {
            Slot::One(v) => Some(v),
            _ => None,
        }
    }

    fn int(&mut self, tag: u32) -> Option<i64> {
        self.scalar(tag).and_then(|v| v.as_i64())
    }

    fn list(&mut self, tag: u32) -> Vec<Value> {
        match self.take(tag).1 {
            Slot::Many(items) => items,
            _ => Vec::new(),
        }
    }

    /// A singular message field, decoded, if present.
    fn message(&mut self, tag: u32) -> Result<Option<Value>, DecodeError> {
        match self.take(tag) {
            (Some(Field { ty: Ty::M(m), .. }), Slot::Chunks(chunks)) => {
                Ok(Some(decode_chunks(*m, &chunks, self.depth)?))
            }
            _ => Ok(None),
        }
    }

    fn malformed(&self, tag: u32, reason: impl Into<String>) -> DecodeError {
        DecodeError::MalformedField {
            message: self.msg.name,
            field: tag,
            reason: reason.into(),
        }
    }
}

fn render_special(
    msg: &'static Message,
    slots: Vec<Slot<'_>>,
    depth: usize,
) -> Result<Value, DecodeError> {
    let mut p = Parts { msg, slots, depth };
    match msg.special {
        Special::None => unreachable!(),
        Special::Quantity => Ok(p.scalar(1).unwrap_or_else(|| Value::from("0"))),
        Special::IntOrString => match p.int(1).unwrap_or(0) {
            0 => Ok(Value::from(p.int(2).unwrap_or(0))),
            1 => Ok(p.scalar(3).unwrap_or_else(|| Value::from(""))),
            other => Err(p.malformed(
                1,
                format!("IntOrString type {other} is neither 0 (int) nor 1 (string)"),
            )),
        },
        Special::Time | Special::MicroTime => {
            let (seconds, nanos) = (p.int(1), p.int(2));
            if seconds.is_none() && nanos.is_none() {
                return Ok(Value::Null); // Go writes a zero time as an empty message
            }
            let (seconds, nanos) = (seconds.unwrap_or(0), nanos.unwrap_or(0));
            if seconds == GO_ZERO_TIME_SECONDS && nanos == 0 {
                return Ok(Value::Null);
            }
            crate::time::format_time(seconds, nanos, msg.special == Special::MicroTime)
                .map(Value::String)
                .map_err(|reason| p.malformed(1, reason))
        }
        Special::Duration => Ok(Value::String(crate::time::go_duration(
            p.int(1).unwrap_or(0),
        ))),
        Special::RawJson => {
            let raw = match p.scalar(1) {
                Some(Value::String(b64)) => base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .expect("we encoded it"),
                _ => Vec::new(),
            };
            raw_json(&raw, depth).map_err(|e| match e {
                RawError::Nested(e) => e,
                RawError::Invalid(reason) => p.malformed(1, reason),
            })
        }
        Special::ListWrapper => Ok(Value::Array(p.list(1))),
        Special::OrArray => {
            let items = p.list(2);
            if !items.is_empty() {
                return Ok(Value::Array(items));
            }
            Ok(p.message(1)?.unwrap_or(Value::Null))
        }
        Special::OrBool => match p.message(2)? {
            Some(schema) => Ok(schema),
            None => Ok(Value::Bool(
                p.scalar(1).and_then(|v| v.as_bool()).unwrap_or(false),
            )),
        },
        Special::OrStringArray => {
            let items = p.list(2);
            if !items.is_empty() {
                return Ok(Value::Array(items));
            }
            Ok(p.message(1)?.unwrap_or(Value::Null))
        }
    }
}

enum RawError {
    Nested(DecodeError),
    Invalid(String),
}

/// Embedded raw bytes: JSON, or a nested `k8s\0` protobuf object.
fn raw_json(raw: &[u8], depth: usize) -> Result<Value, RawError> {
    if raw.is_empty() {
        return Ok(Value::Null);
    }
    if raw.starts_with(crate::MAGIC) {
        return crate::decode_at_depth(raw, depth + 1).map_err(RawError::Nested);
    }
    serde_json::from_slice(raw)
        .map_err(|e| RawError::Invalid(format!("embedded raw bytes are not JSON: {e}")))
}
