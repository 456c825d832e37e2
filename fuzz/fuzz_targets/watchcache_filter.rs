//! The watch cache's filters (`setpoint_apiserver::watchcache`, `pruned`): the attributes a
//! cache records per stored object version, read by parsing only parts of it, and the
//! `resourceVersion` spliced into stored bytes without parsing them.
//!
//! Input: one byte that picks the stored kind, a label selector line, a field selector line,
//! then the stored object (JSON). Must hold, for a stored value that is a JSON object: the
//! attributes parsed from the parts filters read equal those of the whole parsed object; a
//! label and a field selector agree on the attributes and on the parsed object (as a list or
//! watch filter); the value served with its `resourceVersion` spliced in, when the splice is
//! made, is the parsed object with `metadata.resourceVersion` set, whether the value is stored
//! plain or compressed. For anything else: no panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use setpoint_api::selector::{FieldSelector, LabelSelector};
use setpoint_apiserver::watchcache::{decode_object, served_json, stored_kind, Attrs, Filter};
use setpoint_fuzz::first_line;

const PREFIXES: [&str; 11] = [
    "/registry/core/pods/",
    "/registry/core/events/",
    "/registry/core/nodes/",
    "/registry/core/namespaces/",
    "/registry/core/secrets/",
    "/registry/core/services/",
    "/registry/core/configmaps/",
    "/registry/apps/replicasets/",
    "/registry/apps/statefulsets/",
    "/registry/batch/jobs/",
    "/registry/example.com/widgets/",
];

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let prefix = PREFIXES[usize::from(which) % PREFIXES.len()];
    let kind = stored_kind(prefix);
    let (labels, rest) = first_line(rest);
    let (fields, stored) = first_line(rest);
    let revision = i64::from(which) * 7919 + 1;

    let pruned = Attrs::of_stored(stored, kind);
    let served = served_json(stored, revision);
    let Ok(obj) = serde_json::from_slice::<Value>(stored) else {
        return;
    };
    if !obj.is_object() {
        assert!(pruned.is_none(), "attributes of a non-object");
        assert!(decode_object(stored, revision).is_none());
        return;
    }
    let whole = Attrs::of(&obj, kind);
    let pruned = pruned.expect("attributes of a JSON object");
    assert_eq!(
        pruned, whole,
        "the parts filters read give the whole object's attributes"
    );

    let expected = decode_object(stored, revision).expect("a JSON object decodes");
    assert_eq!(
        expected["metadata"]["resourceVersion"],
        revision.to_string(),
        "{expected}"
    );
    if let Some(served) = served {
        let served: Value = serde_json::from_slice(&served).unwrap_or_else(|e| {
            panic!(
                "spliced JSON does not parse ({e}): {:?}",
                String::from_utf8_lossy(&served)
            )
        });
        assert_eq!(
            served, expected,
            "splicing gives what parsing and setting gives"
        );
    }
    let compressed = setpoint_store::compression::compress(stored);
    assert_eq!(
        decode_object(&compressed, revision).as_ref(),
        Some(&expected)
    );
    if let Some(served) = served_json(&compressed, revision) {
        let served: Value = serde_json::from_slice(&served).expect("spliced JSON parses");
        assert_eq!(served, expected);
    }

    // Filters: what a list or watch with these selectors sees.
    let Ok(labels) = std::str::from_utf8(labels) else {
        return;
    };
    let Ok(fields) = std::str::from_utf8(fields) else {
        return;
    };
    let (group, kind_name) = kind.unwrap_or(("example.com", "Widget"));
    let label_selector = LabelSelector::parse(labels).ok();
    let field_selector = FieldSelector::parse(fields).ok().filter(|f| {
        f.requirements()
            .iter()
            .all(|r| setpoint_kinds::fields::supported(group, kind_name, &r.field))
    });
    if let Some(l) = &label_selector {
        assert_eq!(
            l.matches(|k| whole.label(k)),
            l.matches_object(&obj),
            "{labels:?} on the attributes and on the object"
        );
    }
    if let Some(f) = &field_selector {
        let on_object =
            f.matches(|field| setpoint_kinds::fields::value(group, kind_name, &obj, field));
        assert_eq!(
            f.matches(|field| whole.field(field).to_string()),
            on_object,
            "{fields:?} on the attributes and on the object"
        );
    }
    // The filter a namespaced list with both selectors builds.
    let namespace = setpoint_api::meta::namespace(&obj).to_string();
    let name = field_selector
        .as_ref()
        .and_then(|f| f.exact_match("metadata.name"))
        .map(String::from);
    let (l2, f2) = (label_selector.clone(), field_selector.clone());
    let filter = Filter {
        namespace: Some(namespace),
        name,
        predicate: Some(Box::new(move |a: &Attrs| {
            l2.as_ref().is_none_or(|l| l.matches(|k| a.label(k)))
                && f2
                    .as_ref()
                    .is_none_or(|f| f.matches(|field| a.field(field).to_string()))
        })),
    };
    let on_object = label_selector
        .as_ref()
        .is_none_or(|l| l.matches_object(&obj))
        && field_selector.as_ref().is_none_or(|f| {
            f.matches(|field| setpoint_kinds::fields::value(group, kind_name, &obj, field))
        });
    assert_eq!(filter.matches(&pruned), on_object);
});
