//! Duplicate keys in request bodies, for `fieldValidation=Strict|Warn`.
//!
//! serde_json (and serde-saphyr with [`yaml_options`]) keep the last of repeated keys, as
//! Kubernetes does with `fieldValidation=Ignore`; Kubernetes reports them otherwise as
//! `duplicate field "spec.replicas"`. [`json`] finds them with a streaming tokenizer over the raw
//! bytes that keeps only the key spans of the objects currently open; [`yaml`] walks the YAML
//! document through serde with every repeated entry passed through. Both return dotted paths with
//! `[i]` for array elements (`spec.template.spec.containers[0].image`).

use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};

/// The serde-saphyr options request bodies are decoded with: repeated keys reach the visitor, so
/// a `serde_json::Value` keeps the last one (as serde_json does) instead of failing the decode.
pub fn yaml_options() -> serde_saphyr::Options {
    let mut o = serde_saphyr::Options::default();
    o.duplicate_keys = serde_saphyr::DuplicateKeyPolicy::PassThrough;
    o
}

enum Frame {
    /// An open object: its keys are `keys[start..]`; `key` is the current key's span; `expect_key`
    /// is true right after `{` or `,`.
    Object {
        start: usize,
        key: (usize, usize),
        expect_key: bool,
    },
    /// An open array and the index of its current element.
    Array { index: usize },
}

/// Decodes a JSON body as `serde_json::from_slice` does (the last of repeated keys wins, in
/// the first one's place) and says whether any object repeated a key, so that [`json`] has to
/// scan for where only when one did: bodies almost never repeat keys, and the separate scan
/// was a second pass over every request body.
pub fn decode_json(body: &[u8]) -> serde_json::Result<(serde_json::Value, bool)> {
    let mut repeated = false;
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = de::DeserializeSeed::deserialize(
        NotingRepeats {
            repeated: &mut repeated,
        },
        &mut de,
    )?;
    de.end()?;
    Ok((value, repeated))
}

/// Builds a `serde_json::Value` as its own visitor does, setting `repeated` when an object
/// repeats a key.
struct NotingRepeats<'a> {
    repeated: &'a mut bool,
}

impl NotingRepeats<'_> {
    fn again(&mut self) -> NotingRepeats<'_> {
        NotingRepeats {
            repeated: self.repeated,
        }
    }
}

impl<'de> de::DeserializeSeed<'de> for NotingRepeats<'_> {
    type Value = serde_json::Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for NotingRepeats<'_> {
    type Value = serde_json::Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any valid JSON value")
    }
    fn visit_bool<E>(self, b: bool) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Bool(b))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Number(n.into()))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Number(n.into()))
    }
    fn visit_f64<E>(self, n: f64) -> Result<Self::Value, E> {
        Ok(serde_json::Number::from_f64(n)
            .map_or(serde_json::Value::Null, serde_json::Value::Number))
    }
    fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
        Ok(serde_json::Value::String(s.to_owned()))
    }
    fn visit_string<E>(self, s: String) -> Result<Self::Value, E> {
        Ok(serde_json::Value::String(s))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        de::DeserializeSeed::deserialize(self, d)
    }
    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(v) = seq.next_element_seed(self.again())? {
            items.push(v);
        }
        Ok(serde_json::Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(k) = map.next_key::<String>()? {
            let v = map.next_value_seed(self.again())?;
            if out.insert(k, v).is_some() {
                *self.repeated = true;
            }
        }
        Ok(serde_json::Value::Object(out))
    }
}

/// The dotted paths of repeated keys in a JSON document, in document order. Malformed input
/// yields whatever was found before the malformation (the body's decoder reports the error).
pub fn json(body: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    let mut frames: Vec<Frame> = Vec::new();
    // The spans (without quotes) of the keys of every open object, innermost last.
    let mut keys: Vec<(usize, usize)> = Vec::new();
    let mut i = 0;
    let n = body.len();
    while i < n {
        match body[i] {
            b'{' => {
                frames.push(Frame::Object {
                    start: keys.len(),
                    key: (0, 0),
                    expect_key: true,
                });
                i += 1;
            }
            b'[' => {
                frames.push(Frame::Array { index: 0 });
                i += 1;
            }
            b'}' | b']' => {
                if let Some(Frame::Object { start, .. }) = frames.pop() {
                    keys.truncate(start);
                }
                i += 1;
            }
            b',' => {
                match frames.last_mut() {
                    Some(Frame::Object { expect_key, .. }) => *expect_key = true,
                    Some(Frame::Array { index }) => *index += 1,
                    None => {}
                }
                i += 1;
            }
            b'"' => {
                let s = i + 1;
                let e = string_end(body, s);
                if let Some(Frame::Object {
                    start,
                    key,
                    expect_key,
                }) = frames.last_mut()
                {
                    if *expect_key {
                        *expect_key = false;
                        *key = (s, e);
                        let name = &body[s..e];
                        if keys[*start..]
                            .iter()
                            .any(|&(a, b)| same_key(&body[a..b], name))
                        {
                            out.push(json_path(body, &frames));
                        }
                        keys.push((s, e));
                    }
                }
                i = e + 1;
            }
            _ => i += 1,
        }
    }
    out
}

/// The index of the closing quote of the string whose contents start at `s` (or the end).
fn string_end(body: &[u8], mut i: usize) -> usize {
    while i < body.len() {
        match body[i] {
            b'"' => return i,
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
    body.len()
}

/// Whether two raw JSON key spellings name the same key. Keys without escapes compare as bytes;
/// escaped ones (rare) are decoded first.
fn same_key(a: &[u8], b: &[u8]) -> bool {
    if !a.contains(&b'\\') && !b.contains(&b'\\') {
        return a == b;
    }
    unescape(a) == unescape(b)
}

fn unescape(raw: &[u8]) -> String {
    let mut quoted = Vec::with_capacity(raw.len() + 2);
    quoted.push(b'"');
    quoted.extend_from_slice(raw);
    quoted.push(b'"');
    serde_json::from_slice(&quoted).unwrap_or_else(|_| String::from_utf8_lossy(raw).into_owned())
}

fn json_path(body: &[u8], frames: &[Frame]) -> String {
    let mut p = String::new();
    for f in frames {
        match f {
            Frame::Object { key: (a, b), .. } => {
                if !p.is_empty() {
                    p.push('.');
                }
                let raw = &body[*a..*b];
                if raw.contains(&b'\\') {
                    p.push_str(&unescape(raw));
                } else {
                    p.push_str(&String::from_utf8_lossy(raw));
                }
            }
            Frame::Array { index } => {
                p.push('[');
                p.push_str(&index.to_string());
                p.push(']');
            }
        }
    }
    p
}

/// The dotted paths of repeated mapping keys in a YAML document (JSON is YAML too). A document
/// that does not parse yields none: the body's decoder reports the error.
pub fn yaml(text: &str) -> Vec<String> {
    let Ok(shape) = serde_saphyr::from_str_with_options::<Shape>(text, yaml_options()) else {
        return vec![];
    };
    let mut out = Vec::new();
    let mut path = String::new();
    shape.duplicates(&mut path, &mut out);
    out
}

/// The structure of a YAML document with every mapping entry kept, repeated ones included.
enum Shape {
    Leaf,
    Map(Vec<(String, Shape)>),
    Seq(Vec<Shape>),
}

impl Shape {
    fn duplicates(&self, path: &mut String, out: &mut Vec<String>) {
        let len = path.len();
        match self {
            Shape::Leaf => {}
            Shape::Map(entries) => {
                for (i, (k, v)) in entries.iter().enumerate() {
                    if !path.is_empty() {
                        path.push('.');
                    }
                    path.push_str(k);
                    if entries[..i].iter().any(|(prev, _)| prev == k) {
                        out.push(path.clone());
                    }
                    v.duplicates(path, out);
                    path.truncate(len);
                }
            }
            Shape::Seq(items) => {
                for (i, v) in items.iter().enumerate() {
                    path.push_str(&format!("[{i}]"));
                    v.duplicates(path, out);
                    path.truncate(len);
                }
            }
        }
    }
}

impl<'de> de::Deserialize<'de> for Shape {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ShapeVisitor)
    }
}

struct ShapeVisitor;

macro_rules! leaf {
    ($($name:ident: $ty:ty),*) => {
        $(fn $name<E: de::Error>(self, _: $ty) -> Result<Shape, E> {
            Ok(Shape::Leaf)
        })*
    };
}

impl<'de> Visitor<'de> for ShapeVisitor {
    type Value = Shape;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a YAML node")
    }

    leaf!(visit_bool: bool, visit_i64: i64, visit_u64: u64, visit_i128: i128, visit_u128: u128,
        visit_f64: f64, visit_str: &str, visit_bytes: &[u8]);

    fn visit_unit<E: de::Error>(self) -> Result<Shape, E> {
        Ok(Shape::Leaf)
    }

    fn visit_none<E: de::Error>(self) -> Result<Shape, E> {
        Ok(Shape::Leaf)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Shape, D::Error> {
        de::Deserialize::deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Shape, A::Error> {
        let mut items = Vec::new();
        while let Some(v) = seq.next_element::<Shape>()? {
            items.push(v);
        }
        Ok(Shape::Seq(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Shape, A::Error> {
        let mut entries = Vec::new();
        while let Some(k) = map.next_key::<Key>()? {
            let v = map.next_value::<Shape>()?;
            entries.push((k.0, v));
        }
        Ok(Shape::Map(entries))
    }
}

/// A scalar mapping key, spelled as a string.
struct Key(String);

impl<'de> de::Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(KeyVisitor)
    }
}

struct KeyVisitor;

impl Visitor<'_> for KeyVisitor {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a scalar mapping key")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
        Ok(Key(v.to_string()))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Key, E> {
        Ok(Key(v.to_string()))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Key, E> {
        Ok(Key(v.to_string()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Key, E> {
        Ok(Key(v.to_string()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Key, E> {
        Ok(Key(v.to_string()))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Key, E> {
        Ok(Key("null".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_back_as_they_were_decoded() {
        // What is stored is the decoded value written out again; reading it must give the same
        // number (found by fuzzing: without correctly rounded parsing the first one came back
        // one bit off).
        for text in [
            "77777777777777777777777777777777777777777",
            "0.30000000000000004",
            "1.7976931348623157e308",
            "2.2250738585072014e-308",
            "9007199254740993.5",
            "-0.1e-5",
        ] {
            let (v, _) = decode_json(text.as_bytes()).unwrap();
            let again = serde_json::to_vec(&v).unwrap();
            let (back, _) = decode_json(&again).unwrap();
            assert_eq!(
                back,
                v,
                "{text} read back from {}",
                String::from_utf8_lossy(&again)
            );
        }
    }

    #[test]
    fn json_finds_repeated_keys_with_paths() {
        let body = br#"{"spec":{"replicas":1,"template":{"spec":{"containers":[
            {"name":"a","image":"x"},{"name":"b","image":"y","image":"z"}]}},"replicas":2},
            "s":"{\"spec\":1,\"spec\":2}","k\u0061":1,"ka":2}"#;
        assert_eq!(
            json(body),
            vec![
                "spec.template.spec.containers[1].image",
                "spec.replicas",
                "ka"
            ]
        );
        assert!(json(br#"{"a":{"b":1},"c":{"b":2},"d":[{"b":1},{"b":2}]}"#).is_empty());
        assert!(json(b"[1,{\"a\":").is_empty());
        assert!(json(b"").is_empty());
    }

    /// JSON text of a small document, with keys drawn from few names so they repeat.
    fn json_text() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just("null".to_string()),
            Just("true".to_string()),
            (-5i64..5).prop_map(|n| n.to_string()),
            Just("18446744073709551615".to_string()),
            Just("-1.5e300".to_string()),
            Just("2.50".to_string()),
            Just(r#""\u00e9\"x""#.to_string()),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4)
                    .prop_map(|items| format!("[{}]", items.join(","))),
                proptest::collection::vec(
                    (proptest::sample::select(vec!["a", "b", "\\u0061"]), inner),
                    0..4
                )
                .prop_map(|members| {
                    let members: Vec<String> = members
                        .iter()
                        .map(|(k, v)| format!("\"{k}\": {v}"))
                        .collect();
                    format!("{{{}}}", members.join(", "))
                }),
            ]
        })
    }

    proptest::proptest! {
        /// The decode is serde_json's, and says there are repeats exactly when the scan finds
        /// some.
        #[test]
        fn decoding_notes_repeats_as_the_scan_finds_them(text in json_text()) {
            let (v, repeated) = decode_json(text.as_bytes()).unwrap();
            let want: serde_json::Value = serde_json::from_slice(text.as_bytes()).unwrap();
            proptest::prop_assert_eq!(
                serde_json::to_string(&v).unwrap(),
                serde_json::to_string(&want).unwrap()
            );
            proptest::prop_assert_eq!(repeated, !json(text.as_bytes()).is_empty());
        }
    }

    #[test]
    fn decoding_fails_where_serde_json_fails() {
        for bad in [&b"{\"a\": 1"[..], b"{} x", b"", b"[1,]", b"{\"a\" 1}"] {
            assert!(
                decode_json(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
            assert!(serde_json::from_slice::<serde_json::Value>(bad).is_err());
        }
        assert_eq!(decode_json(b" 7 ").unwrap(), (serde_json::json!(7), false));
    }

    #[test]
    fn yaml_finds_repeated_keys_with_paths() {
        let text =
            "spec:\n  replicas: 1\n  replicas: 2\n  list:\n  - a: 1\n    a: 2\nmetadata: {}\n";
        assert_eq!(yaml(text), vec!["spec.replicas", "spec.list[0].a"]);
        assert_eq!(
            yaml(r#"{"spec":{"replicas":1,"replicas":2}}"#),
            vec!["spec.replicas"]
        );
        assert!(yaml("a: 1\nb: {a: 2}\n").is_empty());
        assert!(yaml("a: [").is_empty());
    }

    #[test]
    fn yaml_decoding_keeps_the_last_repeated_key() {
        let v: serde_json::Value =
            serde_saphyr::from_str_with_options("a: 1\na: 2\n", yaml_options()).unwrap();
        assert_eq!(v, serde_json::json!({"a": 2}));
    }
}
