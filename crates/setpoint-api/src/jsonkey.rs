//! [`Key`]: an object key read without copying it when the input allows, for deserializers
//! that look at keys to decide what to build and what to skip.

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserializer, Visitor};

/// A map key, borrowed from the input when it has no escapes (and the input is borrowed).
///
/// ```
/// use setpoint_api::jsonkey::Key;
/// let key: Key = serde_json::from_str(r#""name""#).unwrap();
/// assert!(matches!(key.0, std::borrow::Cow::Borrowed("name")));
/// let escaped: Key = serde_json::from_str(r#""n\u0061me""#).unwrap();
/// assert_eq!(escaped.0, "name");
/// ```
pub struct Key<'de>(pub Cow<'de, str>);

impl<'de> serde::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map key")
            }
            fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v)))
            }
        }
        de.deserialize_str(KeyVisitor)
    }
}
