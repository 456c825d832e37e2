//! Every patch type applied to a valid object through the API server, with `dryRun=All`:
//! JSON merge patch, JSON patch, strategic merge patch and server-side apply.
//!
//! Input: one byte that picks the patch type and the object, then the patch. Must hold: the
//! answer is the patched object or a 4xx `Status` with the response's code, never a server
//! error; a patched object keeps its kind, name and namespace. For merge patches, applying
//! the same patch twice gives what applying it once gave (RFC 7386 patches are idempotent).
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use setpoint_apiserver::patch::merge_patch;
use setpoint_fuzz::{check_reply, fixtures, server, Server};

const PATCH_TYPES: [&str; 4] = [
    "application/merge-patch+json",
    "application/json-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, patch)) = data.split_first() else {
        return;
    };
    let content_type = PATCH_TYPES[usize::from(selector & 3)];
    let which = usize::from(selector >> 2 & 3);
    let all = fixtures();
    let fixture = &all[which % all.len()].1;
    let force = if selector & 0x10 != 0 {
        "&force=true"
    } else {
        ""
    };
    let uri = format!(
        "{}?dryRun=All&fieldManager=fuzz{force}",
        Server::object_path(which)
    );
    let reply = server().request("PATCH", &uri, content_type, patch.to_vec());
    check_reply(&format!("PATCH {uri} as {content_type}"), &reply);
    if reply.status < 300 {
        let got = &reply.body;
        assert_eq!(got["kind"], fixture["kind"], "{got}");
        assert_eq!(
            got["metadata"]["name"], fixture["metadata"]["name"],
            "{got}"
        );
        assert_eq!(got["metadata"]["namespace"], "default", "{got}");
    }
    if let Ok(p) = serde_json::from_slice::<Value>(patch) {
        let once = merge_patch(fixture, &p);
        let twice = merge_patch(&once, &p);
        assert_eq!(once, twice, "a merge patch applied twice: {p}");
    }
});
