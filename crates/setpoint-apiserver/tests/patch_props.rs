//! Property tests of the patch engines against small reference models written from the RFCs:
//! JSON merge patch ([RFC 7386] section 2's pseudocode) and JSON patch ([RFC 6902]).
//!
//! [RFC 7386]: https://www.rfc-editor.org/rfc/rfc7386
//! [RFC 6902]: https://www.rfc-editor.org/rfc/rfc6902

use proptest::prelude::*;
use serde_json::{json, Map, Value};
use setpoint_apiserver::patch::{json_patch, merge_patch, Patch, JSON_PATCH, MERGE_PATCH};

/// Object keys: few, so that documents and patches collide often; two need pointer escapes.
const KEYS: &[&str] = &["a", "b", "c", "0", "x/y", "t~"];

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-3i64..4).prop_map(|n| json!(n)),
        prop::sample::select(vec!["", "s", "t"]).prop_map(|s| json!(s)),
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop::sample::select(KEYS).prop_map(str::to_string)
}

/// Any JSON value, nested up to a few levels.
fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

fn object() -> impl Strategy<Value = Value> {
    prop::collection::vec((key(), value()), 0..5)
        .prop_map(|kv| Value::Object(kv.into_iter().collect()))
}

// ---- RFC 7386 -------------------------------------------------------------------------------

/// Section 2 of RFC 7386, transcribed: an object patch merges into (an object made of) the
/// target, member by member, `null` removing; any other patch replaces the target.
fn merge_model(target: Value, patch: &Value) -> Value {
    let Value::Object(members) = patch else {
        return patch.clone();
    };
    let mut target = match target {
        Value::Object(t) => t,
        _ => Map::new(),
    };
    for (name, v) in members {
        if v.is_null() {
            target.remove(name);
        } else {
            let current = target.remove(name).unwrap_or(Value::Null);
            target.insert(name.clone(), merge_model(current, v));
        }
    }
    Value::Object(target)
}

proptest! {
    #[test]
    fn merge_patch_matches_rfc7386(target in value(), patch in value()) {
        let out = merge_patch(&target, &patch);
        prop_assert_eq!(&out, &merge_model(target.clone(), &patch));
        // Applying the same patch again changes nothing.
        prop_assert_eq!(&merge_patch(&out, &patch), &out);
    }

    #[test]
    fn merge_patch_null_removes(target in object(), patch in object()) {
        let out = merge_patch(&target, &patch);
        let (Value::Object(out), Value::Object(p)) = (&out, &patch) else {
            unreachable!("an object patch yields an object");
        };
        for (k, v) in p {
            if v.is_null() {
                prop_assert!(!out.contains_key(k), "{k} survived a null");
            } else {
                prop_assert!(out.contains_key(k));
            }
        }
        for (k, v) in target.as_object().unwrap() {
            if !p.contains_key(k) {
                prop_assert_eq!(out.get(k), Some(v));
            }
        }
    }

    #[test]
    fn non_object_merge_patch_replaces(
        target in value(),
        patch in prop_oneof![leaf(), prop::collection::vec(value(), 0..4).prop_map(Value::Array)],
    ) {
        prop_assert_eq!(merge_patch(&target, &patch), patch);
    }

    #[test]
    fn decoded_merge_patch_applies_like_merge_patch(target in object(), patch in object()) {
        let body = serde_json::to_vec(&patch).unwrap();
        let decoded = Patch::decode(MERGE_PATCH, &body, None).unwrap();
        prop_assert_eq!(decoded.apply(&target).unwrap(), merge_patch(&target, &patch));
    }
}

// ---- RFC 6902 -------------------------------------------------------------------------------

/// A JSON pointer (RFC 6901) from reference tokens.
fn pointer(tokens: &[String]) -> String {
    tokens
        .iter()
        .map(|t| format!("/{}", t.replace('~', "~0").replace('/', "~1")))
        .collect()
}

fn tokens() -> impl Strategy<Value = Vec<String>> {
    let token = prop_oneof![
        4 => key(),
        2 => prop::sample::select(vec!["1", "2", "-"]).prop_map(str::to_string),
    ];
    prop::collection::vec(token, 1..4)
}

fn op() -> impl Strategy<Value = Value> {
    let kind = prop::sample::select(vec!["add", "remove", "replace", "move", "copy", "test"]);
    (kind, tokens(), tokens(), value()).prop_map(|(kind, path, from, v)| match kind {
        "remove" => json!({"op": kind, "path": pointer(&path)}),
        "move" | "copy" => json!({"op": kind, "path": pointer(&path), "from": pointer(&from)}),
        _ => json!({"op": kind, "path": pointer(&path), "value": v}),
    })
}

/// A document with nested objects and arrays under the usual keys, so pointers hit often.
fn document() -> impl Strategy<Value = Value> {
    object()
}

fn parse_pointer(p: &str) -> Vec<String> {
    p.split('/')
        .skip(1)
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect()
}

/// An array index token: `-` (one past the end, if allowed) or a decimal without leading zeros.
fn index(token: &str, len: usize, past_end: bool) -> Option<usize> {
    if token == "-" {
        return past_end.then_some(len);
    }
    if token.is_empty()
        || !token.bytes().all(|b| b.is_ascii_digit())
        || (token.len() > 1 && token.starts_with('0'))
    {
        return None;
    }
    let i: usize = token.parse().ok()?;
    let limit = if past_end { len } else { len.saturating_sub(1) };
    (i <= limit && (past_end || len > 0)).then_some(i)
}

fn get<'a>(doc: &'a Value, tokens: &[String]) -> Option<&'a Value> {
    tokens.iter().try_fold(doc, |v, t| match v {
        Value::Object(m) => m.get(t),
        Value::Array(a) => a.get(index(t, a.len(), false)?),
        _ => None,
    })
}

fn get_mut<'a>(doc: &'a mut Value, tokens: &[String]) -> Option<&'a mut Value> {
    tokens.iter().try_fold(doc, |v, t| match v {
        Value::Object(m) => m.get_mut(t),
        Value::Array(a) => {
            let i = index(t, a.len(), false)?;
            a.get_mut(i)
        }
        _ => None,
    })
}

fn model_add(doc: &mut Value, tokens: &[String], v: Value) -> Option<()> {
    let (last, parent) = tokens.split_last()?;
    match get_mut(doc, parent)? {
        Value::Object(m) => {
            m.insert(last.clone(), v);
        }
        Value::Array(a) => {
            let i = index(last, a.len(), true)?;
            a.insert(i, v);
        }
        _ => return None,
    }
    Some(())
}

fn model_remove(doc: &mut Value, tokens: &[String]) -> Option<Value> {
    let (last, parent) = tokens.split_last()?;
    match get_mut(doc, parent)? {
        Value::Object(m) => m.remove(last),
        Value::Array(a) => {
            let i = index(last, a.len(), false)?;
            Some(a.remove(i))
        }
        _ => None,
    }
}

/// One operation of RFC 6902 section 4; `None` is an error.
fn model_op(doc: &mut Value, op: &Value) -> Option<()> {
    let path = parse_pointer(op["path"].as_str()?);
    let from = op.get("from").and_then(Value::as_str);
    match op["op"].as_str()? {
        "add" => model_add(doc, &path, op["value"].clone()),
        "remove" => model_remove(doc, &path).map(drop),
        "replace" => {
            *get_mut(doc, &path)? = op["value"].clone();
            Some(())
        }
        "move" => {
            let from_ptr = from?;
            let to_ptr = op["path"].as_str()?;
            // "The "from" location MUST NOT be a proper prefix of the "path" location."
            if to_ptr.starts_with(&format!("{from_ptr}/")) {
                return None;
            }
            let v = model_remove(doc, &parse_pointer(from_ptr))?;
            model_add(doc, &path, v)
        }
        "copy" => {
            let v = get(doc, &parse_pointer(from?))?.clone();
            model_add(doc, &path, v)
        }
        "test" => (get(doc, &path)? == &op["value"]).then_some(()),
        _ => None,
    }
}

/// A patch applies as a whole or not at all (section 5).
fn model_patch(doc: &Value, ops: &[Value]) -> Option<Value> {
    let mut out = doc.clone();
    for op in ops {
        model_op(&mut out, op)?;
    }
    Some(out)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn json_patch_matches_rfc6902(doc in document(), ops in prop::collection::vec(op(), 1..6)) {
        let before = doc.clone();
        let got = json_patch(&doc, &ops);
        prop_assert_eq!(&doc, &before);
        match (model_patch(&doc, &ops), got) {
            (Some(want), Ok(got)) => prop_assert_eq!(got, want),
            (None, Err(e)) => prop_assert_eq!(e.code, 422, "{}", e.message),
            (want, got) => prop_assert!(
                false,
                "ops {} on {}: model {:?}, server {:?}",
                Value::Array(ops.clone()), doc, want, got.map_err(|e| e.message)
            ),
        }
    }

    /// Ops that succeed, then a `test` that cannot: the whole patch fails with 422 and the
    /// document is left as it was.
    #[test]
    fn failed_test_leaves_the_document_unchanged(
        doc in document(),
        ops in prop::collection::vec(op(), 0..5),
        path in tokens(),
    ) {
        let ops: Vec<Value> = ops
            .into_iter()
            .scan(doc.clone(), |d, op| {
                // On a clone: a failing op may have changed part of the document.
                let mut next = d.clone();
                Some(model_op(&mut next, &op).map(|()| {
                    *d = next;
                    op
                }))
            })
            .flatten()
            .collect();
        let after = model_patch(&doc, &ops).expect("only ops that applied were kept");
        let ptr = pointer(&path);
        // An array holding the current value (or null) never equals that value.
        let differs = json!([get(&after, &path).cloned().unwrap_or(Value::Null)]);
        let mut all = ops.clone();
        all.push(json!({"op": "test", "path": ptr, "value": differs}));

        let before = doc.clone();
        let body = serde_json::to_vec(&all).unwrap();
        let patch = Patch::decode(JSON_PATCH, &body, None).unwrap();
        let err = patch.apply(&doc).unwrap_err();
        prop_assert_eq!(err.code, 422);
        let err = json_patch(&doc, &all).unwrap_err();
        prop_assert_eq!(err.code, 422);
        prop_assert_eq!(&doc, &before);
        // Without the failing test the same ops apply as the model says.
        prop_assert_eq!(json_patch(&doc, &ops).unwrap(), after);
    }
}

#[test]
fn dash_appends_to_arrays() {
    let doc = json!({"a": [1, 2]});
    let ops = vec![
        json!({"op": "add", "path": "/a/-", "value": 3}),
        json!({"op": "copy", "from": "/a/0", "path": "/a/-"}),
        json!({"op": "move", "from": "/a/1", "path": "/a/-"}),
    ];
    let want = json!({"a": [1, 3, 1, 2]});
    assert_eq!(model_patch(&doc, &ops), Some(want.clone()));
    assert_eq!(json_patch(&doc, &ops).unwrap(), want);
    let bad = vec![json!({"op": "remove", "path": "/a/-"})];
    assert_eq!(model_patch(&doc, &bad), None);
    assert_eq!(json_patch(&doc, &bad).unwrap_err().code, 422);
}
