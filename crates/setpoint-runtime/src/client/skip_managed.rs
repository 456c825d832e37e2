//! Decoding an object while skipping `metadata.managedFields`.
//!
//! Informers that drop field ownership (`InformerOptions::strip_managed_fields`) would otherwise
//! build it first: on a pod it is a large nested map, decoded into a `serde_json::Value` tree
//! for every watch event only to be freed. This deserializer wraps serde_json's and passes the
//! `managedFields` entry of the top-level `metadata` over unread (it is still checked to be
//! well-formed JSON). Everything else reaches the target type exactly as it would without the
//! wrapper.

use std::borrow::Cow;
use std::fmt;

use serde::de::value::{BorrowedStrDeserializer, CowStrDeserializer};
use serde::de::{
    DeserializeOwned, DeserializeSeed, Deserializer, EnumAccess, IgnoredAny, MapAccess, SeqAccess,
    Visitor,
};
use setpoint_api::jsonkey::Key;

/// Decodes `json` as `K`, leaving out `metadata.managedFields`.
pub(crate) fn from_str<K: DeserializeOwned>(json: &str) -> serde_json::Result<K> {
    let mut de = serde_json::Deserializer::from_str(json);
    let value = K::deserialize(Skip {
        de: &mut de,
        level: Level::Object,
    })?;
    de.end()?;
    Ok(value)
}

/// Where in the object a map is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Level {
    /// The object itself: its `metadata` value is read at [`Level::Metadata`].
    Object,
    /// The object's `metadata`: its `managedFields` entry is skipped.
    Metadata,
}

/// A deserializer that hands maps at `level` to [`SkipMap`]; every other request goes to the
/// wrapped deserializer unchanged.
struct Skip<D> {
    de: D,
    level: Level,
}

/// Requests that cannot reach a map at this level go straight through.
macro_rules! forward {
    ($($method:ident),* $(,)?) => {
        $(
            fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
                self.de.$method(visitor)
            }
        )*
    };
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Skip<D> {
    type Error = D::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.de.deserialize_any(wrap(visitor, self.level))
    }
    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.de.deserialize_map(wrap(visitor, self.level))
    }
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.de
            .deserialize_struct(name, fields, wrap(visitor, self.level))
    }
    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.de.deserialize_option(wrap(visitor, self.level))
    }
    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.de
            .deserialize_newtype_struct(name, wrap(visitor, self.level))
    }
    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.de.deserialize_unit_struct(name, visitor)
    }
    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.de.deserialize_tuple(len, visitor)
    }
    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.de.deserialize_tuple_struct(name, len, visitor)
    }
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.de.deserialize_enum(name, variants, visitor)
    }
    forward!(
        deserialize_bool,
        deserialize_i8,
        deserialize_i16,
        deserialize_i32,
        deserialize_i64,
        deserialize_i128,
        deserialize_u8,
        deserialize_u16,
        deserialize_u32,
        deserialize_u64,
        deserialize_u128,
        deserialize_f32,
        deserialize_f64,
        deserialize_char,
        deserialize_str,
        deserialize_string,
        deserialize_bytes,
        deserialize_byte_buf,
        deserialize_unit,
        deserialize_seq,
        deserialize_identifier,
        deserialize_ignored_any,
    );
    fn is_human_readable(&self) -> bool {
        self.de.is_human_readable()
    }
}

/// A visitor that passes a map on as a [`SkipMap`] and anything else through.
struct Wrap<V> {
    visitor: V,
    level: Level,
}

fn wrap<V>(visitor: V, level: Level) -> Wrap<V> {
    Wrap { visitor, level }
}

macro_rules! forward_visit {
    ($($method:ident($ty:ty)),* $(,)?) => {
        $(
            fn $method<E: serde::de::Error>(self, v: $ty) -> Result<Self::Value, E> {
                self.visitor.$method(v)
            }
        )*
    };
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Wrap<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.visitor.expecting(f)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        self.visitor.visit_map(SkipMap {
            map,
            level: self.level,
            next_is_metadata: false,
        })
    }
    fn visit_some<D: Deserializer<'de>>(self, de: D) -> Result<Self::Value, D::Error> {
        self.visitor.visit_some(Skip {
            de,
            level: self.level,
        })
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(self, de: D) -> Result<Self::Value, D::Error> {
        self.visitor.visit_newtype_struct(Skip {
            de,
            level: self.level,
        })
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        self.visitor.visit_seq(seq)
    }
    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<Self::Value, A::Error> {
        self.visitor.visit_enum(data)
    }
    fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        self.visitor.visit_none()
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        self.visitor.visit_unit()
    }
    fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        self.visitor.visit_borrowed_str(v)
    }
    fn visit_borrowed_bytes<E: serde::de::Error>(self, v: &'de [u8]) -> Result<Self::Value, E> {
        self.visitor.visit_borrowed_bytes(v)
    }
    forward_visit!(
        visit_bool(bool),
        visit_i8(i8),
        visit_i16(i16),
        visit_i32(i32),
        visit_i64(i64),
        visit_i128(i128),
        visit_u8(u8),
        visit_u16(u16),
        visit_u32(u32),
        visit_u64(u64),
        visit_u128(u128),
        visit_f32(f32),
        visit_f64(f64),
        visit_char(char),
        visit_str(&str),
        visit_string(String),
        visit_bytes(&[u8]),
        visit_byte_buf(Vec<u8>),
    );
}

/// A map at `level`: reads each key itself, skips `managedFields` in `metadata`, and hands
/// the object's `metadata` value to a [`Skip`] one level down.
struct SkipMap<A> {
    map: A,
    level: Level,
    next_is_metadata: bool,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for SkipMap<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        loop {
            let Some(Key(key)) = self.map.next_key::<Key<'de>>()? else {
                return Ok(None);
            };
            if self.level == Level::Metadata && key == "managedFields" {
                self.map.next_value::<IgnoredAny>()?;
                continue;
            }
            self.next_is_metadata = self.level == Level::Object && key == "metadata";
            return match key {
                Cow::Borrowed(k) => seed.deserialize(BorrowedStrDeserializer::new(k)),
                owned => seed.deserialize(CowStrDeserializer::new(owned)),
            }
            .map(Some);
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        if std::mem::take(&mut self.next_is_metadata) {
            self.map.next_value_seed(MetadataSeed(seed))
        } else {
            self.map.next_value_seed(seed)
        }
    }
}

/// Reads the `metadata` value through a [`Skip`] at [`Level::Metadata`].
struct MetadataSeed<S>(S);

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for MetadataSeed<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<S::Value, D::Error> {
        self.0.deserialize(Skip {
            de,
            level: Level::Metadata,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::DynamicObject;
    use crate::Object;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::{json, Value};

    fn pod_json() -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "p",
                "namespace": "n",
                "labels": {"app": "a", "managedFields": "a label, kept"},
                "managedFields": [{
                    "manager": "m", "operation": "Update", "apiVersion": "v1",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {"f:containers": {"k:{\"name\":\"c\"}": {".": {}}}}}
                }],
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": "rs", "uid": "u1", "controller": true}],
                "resourceVersion": "42"
            },
            "spec": {"containers": [{"name": "c", "image": "i",
                "env": [{"name": "metadata", "value": "{\"managedFields\":1}"}]}],
                "nodeName": "n1"},
            "status": {"phase": "Running", "podIP": "10.0.0.1"}
        })
    }

    /// The definition the decoder must agree with: decode everything, then drop the field.
    fn decoded_then_stripped<K: DeserializeOwned + Object>(json: &str) -> K {
        let mut k: K = serde_json::from_str(json).unwrap();
        k.strip_managed_fields();
        k
    }

    #[test]
    fn typed_and_dynamic_objects_equal_decoding_then_stripping() {
        let text = serde_json::to_string(&pod_json()).unwrap();
        let pod: Pod = from_str(&text).unwrap();
        assert_eq!(pod, decoded_then_stripped::<Pod>(&text));
        assert_eq!(pod.metadata.managed_fields, None);
        assert_eq!(
            pod.metadata.owner_references.as_ref().unwrap()[0].name,
            "rs"
        );
        assert_eq!(pod.spec.as_ref().unwrap().node_name.as_deref(), Some("n1"));

        let dynamic: DynamicObject = from_str(&text).unwrap();
        assert_eq!(dynamic, decoded_then_stripped::<DynamicObject>(&text));
        // Only the top-level metadata loses the field; lookalikes elsewhere stay.
        assert_eq!(
            dynamic.0["metadata"]["labels"]["managedFields"],
            "a label, kept"
        );
        assert_eq!(
            dynamic.0["spec"]["containers"][0]["env"][0]["name"],
            "metadata"
        );
    }

    #[test]
    fn escaped_keys_odd_shapes_and_errors() {
        // An escaped key is not borrowed from the input; it must still be matched.
        let escaped = r#"{"metadata":{"name":"x","managed\u0046ields":[1]},"spec":{}}"#;
        let d: DynamicObject = from_str(escaped).unwrap();
        assert_eq!(d.0, json!({"metadata": {"name": "x"}, "spec": {}}));
        // No metadata, null metadata, metadata that is not an object.
        for text in [r#"{"kind":"Pod"}"#, r#"{"metadata":null}"#] {
            let d: DynamicObject = from_str(text).unwrap();
            assert_eq!(d, decoded_then_stripped::<DynamicObject>(text));
            let p: Pod = from_str(text).unwrap();
            assert_eq!(p, decoded_then_stripped::<Pod>(text));
        }
        let d: DynamicObject = from_str(r#"{"metadata":[1,2]}"#).unwrap();
        assert_eq!(d.0, json!({"metadata": [1, 2]}));
        // Malformed input is an error, inside the skipped field too, or after the object.
        assert!(from_str::<Pod>(r#"{"metadata":{"managedFields":[1,}}"#).is_err());
        assert!(from_str::<Pod>(r#"{"metadata":{}} trailing"#).is_err());
        assert!(from_str::<Pod>(r#"{"metadata":{"name":5}}"#).is_err());
    }
}
