//! Label and field selectors (`setpoint_api::selector`), as `labelSelector=`/`fieldSelector=`
//! strings and as `metav1.LabelSelector` objects.
//!
//! Input: UTF-8 text. When it starts with `{`, its first line is a `metav1.LabelSelector` in
//! JSON; otherwise the first line is a label selector string and the second a field selector
//! string. The remaining lines are `key=value` labels (and fields) to match.
//!
//! Must hold: a selector that parses, printed and parsed again, is the same selector (field
//! selectors: the same terms; their order follows the text) and prints the same; both match
//! the same labels; a set of labels that matches carries every label the selector pins
//! (`required_labels`); the empty string is the selector that matches everything.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use setpoint_api::selector::{FieldSelector, LabelSelector};

fn check_label_selector(sel: &LabelSelector, labels: &BTreeMap<String, String>) {
    let printed = sel.to_string();
    let again = LabelSelector::parse(&printed)
        .unwrap_or_else(|e| panic!("{sel:?} prints as {printed:?}, which does not parse: {e}"));
    if sel.is_nothing() {
        // Nothing has no string form of its own: it prints as "", which selects everything
        // (upstream's `labels.Nothing().String()` is "" too).
        assert!(again.is_empty());
        assert!(!sel.matches(|k| labels.get(k).map(String::as_str)));
        return;
    }
    assert_eq!(&again, sel, "{printed:?} parses back to the same selector");
    assert_eq!(again.to_string(), printed, "printing is stable");
    let get = |k: &str| labels.get(k).map(String::as_str);
    let matched = sel.matches(get);
    assert_eq!(matched, again.matches(get));
    assert_eq!(sel.is_empty(), printed.is_empty());
    if matched {
        for (k, v) in sel.required_labels() {
            assert_eq!(
                get(k),
                Some(v),
                "{printed:?} matched {labels:?} without {k}={v}"
            );
        }
    }
    let as_json: serde_json::Map<String, serde_json::Value> = labels
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect();
    assert_eq!(matched, sel.matches_map(&as_json));
}

fn check_field_selector(sel: &FieldSelector, fields: &BTreeMap<String, String>) {
    let printed = sel.to_string();
    let again = FieldSelector::parse(&printed)
        .unwrap_or_else(|e| panic!("{sel:?} prints as {printed:?}, which does not parse: {e}"));
    let mut terms: Vec<String> = sel.requirements().iter().map(|r| r.to_string()).collect();
    let mut terms_again: Vec<String> = again.requirements().iter().map(|r| r.to_string()).collect();
    terms.sort();
    terms_again.sort();
    assert_eq!(
        terms, terms_again,
        "{printed:?} parses back to the same terms"
    );
    assert_eq!(sel.is_empty(), again.is_empty());
    let reprinted = again.to_string();
    assert_eq!(
        FieldSelector::parse(&reprinted).map(|s| s.to_string()),
        Ok(reprinted.clone()),
        "printing a parsed selector is stable"
    );
    let get = |f: &str| fields.get(f).cloned().unwrap_or_default();
    assert_eq!(sel.matches(get), again.matches(get));
    for r in sel.requirements() {
        if let Some(v) = sel.exact_match(&r.field) {
            if sel.matches(get) {
                assert_eq!(get(&r.field), v);
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut lines = text.split('\n');
    let first = lines.next().unwrap_or("");
    let second = if first.starts_with('{') {
        ""
    } else {
        lines.next().unwrap_or("")
    };
    let labels: BTreeMap<String, String> = lines
        .map(|l| match l.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => (l.to_string(), String::new()),
        })
        .collect();
    assert!(LabelSelector::parse("").is_ok_and(|s| s.is_empty()));
    if first.starts_with('{') {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(first) else {
            return;
        };
        if let Ok(sel) = LabelSelector::from_label_selector_json(&v) {
            check_label_selector(&sel, &labels);
            assert_eq!(
                LabelSelector::label_selector_json_to_string(&v).as_deref(),
                Ok(sel.to_string().as_str())
            );
        }
        return;
    }
    if let Ok(sel) = LabelSelector::parse(first) {
        check_label_selector(&sel, &labels);
    }
    if let Ok(sel) = FieldSelector::parse(second) {
        check_field_selector(&sel, &labels);
    }
});
