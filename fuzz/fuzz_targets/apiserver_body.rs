//! Create requests through the whole API server (routing, body decoding, defaulting,
//! validation, storage semantics) with `dryRun=All`, so nothing is kept between inputs.
//!
//! Input: one byte that picks the content type, the collection and `fieldValidation`, then
//! the body. Must hold: the answer is never a server error; it is a JSON object, and an error
//! is a `Status` with the response's code; a created object has the collection's kind and a
//! name; a JSON body sent as YAML (JSON is YAML) that YAML reads as the same value gets the
//! same status.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use setpoint_apiserver::dupfields;
use setpoint_fuzz::{check_reply, fixtures, server};

const CONTENT_TYPES: [&str; 3] = [
    "application/json",
    "application/yaml",
    "application/vnd.kubernetes.protobuf",
];
const VALIDATION: [&str; 3] = ["Strict", "Warn", "Ignore"];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let all = fixtures();
    let content_type = CONTENT_TYPES[usize::from(selector & 3) % CONTENT_TYPES.len()];
    let (collection, fixture) = &all[usize::from(selector >> 2 & 3) % all.len()];
    let validation = VALIDATION[usize::from(selector >> 4) % VALIDATION.len()];
    let uri = format!("{collection}?dryRun=All&fieldValidation={validation}");
    let s = server();
    let reply = s.request("POST", &uri, content_type, body.to_vec());
    check_reply(&format!("POST {uri} as {content_type}"), &reply);
    if reply.status < 300 {
        assert_eq!(reply.body["kind"], fixture["kind"], "{}", reply.body);
        assert!(
            reply.body["metadata"]["name"]
                .as_str()
                .is_some_and(|n| !n.is_empty()),
            "a created object has a name: {}",
            reply.body
        );
    }
    // Only when both decoders read the same value: `-0` is the float -0.0 to serde_json and
    // the integer 0 to YAML, for instance, and the server rightly treats those differently.
    let as_json = serde_json::from_slice::<Value>(body).ok();
    let as_yaml = std::str::from_utf8(body).ok().and_then(|text| {
        serde_saphyr::from_str_with_options::<Value>(text, dupfields::yaml_options()).ok()
    });
    if content_type == "application/json"
        && as_json.as_ref().is_some_and(Value::is_object)
        && as_json == as_yaml
    {
        let as_yaml = s.request("POST", &uri, "application/yaml", body.to_vec());
        check_reply(&format!("POST {uri} as YAML"), &as_yaml);
        assert_eq!(
            as_yaml.status, reply.status,
            "the same JSON as JSON ({}) and as YAML ({})",
            reply.body, as_yaml.body
        );
    }
});
