//! YAML request bodies (create/update with `application/yaml`, server-side apply), decoded
//! with the options the API server uses (`dupfields::yaml_options`).
//!
//! Must hold: a document that decodes, encoded again as JSON (with no key longer than YAML
//! allows a key to be), decodes through the YAML decoder to the same value and through
//! serde_json too (a client may send either form of one object); the duplicate-field scan
//! (`dupfields::yaml`) finds nothing in what was re-encoded, and never panics on anything.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use setpoint_apiserver::dupfields;

fn decode(text: &str) -> Result<Value, serde_saphyr::Error> {
    serde_saphyr::from_str_with_options(text, dupfields::yaml_options())
}

/// Whether some object key of `v`, written as JSON, is longer than YAML allows an implicit
/// key to be (1024 characters; Go's YAML parser enforces the same limit).
fn has_long_key(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.iter().any(|(k, x)| {
            serde_json::to_string(k).map_or(true, |s| s.chars().count() > 1000) || has_long_key(x)
        }),
        Value::Array(a) => a.iter().any(has_long_key),
        _ => false,
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = dupfields::yaml(text);
    let Ok(value) = decode(text) else {
        return;
    };
    // JSON is YAML: the server reads an apply body that is JSON through the YAML decoder too.
    if has_long_key(&value) {
        return;
    }
    let json = serde_json::to_string(&value).expect("a Value encodes as JSON");
    let from_json = decode(&json).unwrap_or_else(|e| panic!("{json:?} does not decode: {e}"));
    assert_eq!(
        from_json, value,
        "JSON of the value decodes as YAML to itself"
    );
    assert!(
        dupfields::yaml(&json).is_empty(),
        "no repeated keys in {json:?}"
    );
    let (from_serde, repeated) =
        dupfields::decode_json(json.as_bytes()).expect("encoded JSON decodes as JSON");
    assert_eq!(from_serde, value, "the JSON decoder reads the same value");
    assert!(!repeated);
});
