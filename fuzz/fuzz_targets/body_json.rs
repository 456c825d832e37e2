//! JSON request bodies, as the API server decodes them (`dupfields::decode_json`).
//!
//! Must hold: the decoder accepts exactly what serde_json accepts and builds the same value
//! (the last of repeated keys wins); it says a key repeated exactly when the duplicate-field
//! scan (`dupfields::json`) finds one; the value, encoded again, decodes to itself with no
//! repeated key.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use setpoint_apiserver::dupfields;

fuzz_target!(|data: &[u8]| {
    let decoded = dupfields::decode_json(data);
    let plain = serde_json::from_slice::<Value>(data);
    let (value, repeated) = match (decoded, plain) {
        (Ok((value, repeated)), Ok(plain)) => {
            assert_eq!(value, plain, "the same value serde_json builds");
            (value, repeated)
        }
        (Err(_), Err(_)) => {
            // The scan runs only on bodies that decode; on others it must still not panic.
            let _ = dupfields::json(data);
            return;
        }
        (d, p) => panic!(
            "the decoder and serde_json disagree on {:?}: {:?} vs {:?}",
            String::from_utf8_lossy(data),
            d.map(|_| ()),
            p.map(|_| ())
        ),
    };
    let found = dupfields::json(data);
    assert_eq!(
        repeated,
        !found.is_empty(),
        "decode says repeated={repeated}, the scan found {found:?}"
    );
    let again = serde_json::to_vec(&value).expect("a Value encodes");
    let (back, back_repeated) = dupfields::decode_json(&again).expect("encoded JSON decodes");
    assert_eq!(back, value, "re-encoded JSON decodes to the same value");
    assert!(!back_repeated, "an encoded map has no repeated keys");
    assert!(dupfields::json(&again).is_empty());
});
