//! Export and import between stores: memory → embedded → memory keeps every key and value
//! byte for byte (compressed values export as readable JSON and come back compressed); a
//! non-empty target is refused unless forced; damaged streams are refused.

use bytes::Bytes;
use setpoint_store::compression;
use setpoint_store::embedded::{EmbeddedOptions, EmbeddedStore};
use setpoint_store::memory::MemoryStore;
use setpoint_store::migrate::{self, MigrateError, COMPACTION_GUARD_KEY};
use setpoint_store::{Precondition, RangeRequest, Store};

/// Every key and value under `/registry/` except the compaction guard.
async fn contents(store: &dyn Store) -> Vec<(String, Bytes)> {
    let resp = store
        .range(RangeRequest {
            prefix: "/registry/".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    resp.kvs
        .into_iter()
        .filter(|kv| &*kv.key != COMPACTION_GUARD_KEY)
        .map(|kv| (kv.key.to_string(), kv.value))
        .collect()
}

/// A source with more keys than one export page, values of every shape the format must carry
/// verbatim, a deleted key, an overwritten key, the guard and a key outside `/registry/`.
async fn populated() -> MemoryStore {
    let store = MemoryStore::new();
    for i in 0..600 {
        let value = format!(
            r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"cm-{i}","uid":"u-{i}","generation":{i},"creationTimestamp":"2026-01-01T00:00:00Z","managedFields":[{{"manager":"kubectl"}}]}},"data":{{"n":1.50}}}}"#
        );
        // Half of them kept compressed, as the API server stores objects.
        let value = if i % 2 == 0 {
            compression::compress(value.as_bytes())
        } else {
            Bytes::from(value)
        };
        store
            .put(
                &format!("/registry/configmaps/default/cm-{i:04}"),
                value,
                Precondition::NotExists,
            )
            .await
            .unwrap();
    }
    // Compressed, but not compact JSON once decompressed; and a value framed only because it
    // starts with a zero byte.
    let spaced = compression::compress(" {\"a\": 1} ".repeat(20).as_bytes());
    let zero = compression::compress(&[0, 1, 2]);
    assert!(compression::is_compressed(&spaced) && compression::is_compressed(&zero));
    let odd: [(&str, &[u8]); 8] = [
        ("/registry/odd/compressed-spaced", &spaced),
        ("/registry/odd/compressed-zero", &zero),
        ("/registry/odd/null", b"null"),
        ("/registry/odd/spaced", b" {\"a\": 1} "),
        ("/registry/odd/newline", b"{\"a\":\n1}"),
        (
            "/registry/odd/binary",
            &[0x6b, 0x38, 0x73, 0x00, 0xff, 0x0a],
        ),
        ("/registry/odd/empty", b""),
        (
            "/registry/_allocations/serviceips/10.96.0.10",
            b"default/web",
        ),
    ];
    for (k, v) in odd {
        store
            .put(k, Bytes::copy_from_slice(v), Precondition::None)
            .await
            .unwrap();
    }
    store
        .put("/registry/gone", Bytes::from("{}"), Precondition::None)
        .await
        .unwrap();
    store
        .delete("/registry/gone", Precondition::None)
        .await
        .unwrap();
    store
        .put(COMPACTION_GUARD_KEY, Bytes::from("7"), Precondition::None)
        .await
        .unwrap();
    store
        .put("/elsewhere", Bytes::from("{}"), Precondition::None)
        .await
        .unwrap();
    store
}

async fn export_bytes(store: &dyn Store) -> Vec<u8> {
    let mut out = Vec::new();
    let summary = migrate::export(store, &mut out).await.unwrap();
    assert_eq!(summary.count, contents(store).await.len() as u64);
    out
}

#[tokio::test]
async fn memory_embedded_memory_round_trip() {
    let source = populated().await;
    let expected = contents(&source).await;
    assert_eq!(expected.len(), 608);
    let exported = export_bytes(&source).await;

    let text = String::from_utf8(exported.clone()).unwrap();
    let mut lines = text.lines();
    let header: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!(header["format"], "setpoint-export");
    assert_eq!(header["version"], 1);
    assert_eq!(header["revision"], source.current_revision().await.unwrap());
    assert_eq!(header["count"], 608);
    assert!(!text.contains("/registry/_compact"));
    assert!(!text.contains("/elsewhere"));
    // Compact JSON is embedded as JSON, byte for byte (`1.50` is not normalized to `1.5`).
    assert!(text.contains(r#""data":{"n":1.50}}}"#), "{text:.400}");
    assert_eq!(migrate::value_encoding(b" {\"a\": 1} "), "base64");
    // Compressed objects are exported readable, and marked.
    assert!(
        text.contains(r#""name":"cm-2","uid":"u-2""#) && text.contains(r#""compressed":true"#),
        "{text:.400}"
    );
    assert_eq!(text.matches(r#""compressed":true"#).count(), 300);

    let dir = tempfile::tempdir().unwrap();
    let embedded = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap();
    let summary = migrate::import(&embedded, &mut exported.as_slice(), false)
        .await
        .unwrap();
    assert_eq!(summary.count, 608);
    assert_eq!(summary.overwritten, 0);
    assert_eq!(contents(&embedded).await, expected);
    assert!(embedded.get("/elsewhere").await.unwrap().is_none());
    embedded.close().await;
    drop(embedded);

    // Reopened from disk, exported again and imported into memory: still identical.
    let embedded = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap();
    let again = export_bytes(&embedded).await;
    let back = MemoryStore::new();
    migrate::import(&back, &mut again.as_slice(), false)
        .await
        .unwrap();
    assert_eq!(contents(&back).await, expected);
    embedded.close().await;
}

#[tokio::test]
async fn non_empty_target_is_refused_unless_forced() {
    let source = populated().await;
    let exported = export_bytes(&source).await;

    let target = MemoryStore::new();
    // The guard alone does not make a store non-empty: a server writes it on its own.
    target
        .put(COMPACTION_GUARD_KEY, Bytes::from("1"), Precondition::None)
        .await
        .unwrap();
    target
        .put(
            "/registry/configmaps/default/cm-0001",
            Bytes::from("{\"stale\":true}"),
            Precondition::None,
        )
        .await
        .unwrap();
    let err = migrate::import(&target, &mut exported.as_slice(), false)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, MigrateError::NotEmpty { key } if key == "/registry/configmaps/default/cm-0001"),
        "{err}"
    );
    // Nothing was written.
    assert_eq!(contents(&target).await.len(), 1);

    let summary = migrate::import(&target, &mut exported.as_slice(), true)
        .await
        .unwrap();
    assert_eq!(summary.overwritten, 1);
    assert_eq!(contents(&target).await, contents(&source).await);

    // An empty store apart from the guard is accepted without force.
    let guarded = MemoryStore::new();
    guarded
        .put(COMPACTION_GUARD_KEY, Bytes::from("1"), Precondition::None)
        .await
        .unwrap();
    migrate::import(&guarded, &mut exported.as_slice(), false)
        .await
        .unwrap();
}

#[tokio::test]
async fn damaged_streams_are_refused() {
    let source = populated().await;
    let exported = export_bytes(&source).await;
    let text = String::from_utf8(exported).unwrap();

    let err = migrate::import(&MemoryStore::new(), &mut &b""[..], false)
        .await
        .unwrap_err();
    assert!(matches!(err, MigrateError::BadHeader(_)), "{err}");

    let not_ours = b"{\"format\":\"other\",\"version\":1,\"revision\":1,\"count\":0}\n";
    let err = migrate::import(&MemoryStore::new(), &mut &not_ours[..], false)
        .await
        .unwrap_err();
    assert!(matches!(err, MigrateError::BadHeader(_)), "{err}");

    let future = text.replacen("\"version\":1", "\"version\":2", 1);
    let err = migrate::import(&MemoryStore::new(), &mut future.as_bytes(), false)
        .await
        .unwrap_err();
    assert!(matches!(err, MigrateError::UnsupportedVersion(2)), "{err}");

    // Cut after 100 key lines: the count check catches it.
    let truncated: String = text.lines().take(101).map(|l| format!("{l}\n")).collect();
    let err = migrate::import(&MemoryStore::new(), &mut truncated.as_bytes(), false)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            MigrateError::CountMismatch {
                expected: 608,
                found: 100
            }
        ),
        "{err}"
    );

    let guard_line = format!(
        "{}\n{{\"key\":\"{COMPACTION_GUARD_KEY}\",\"value\":1}}\n",
        text.lines().next().unwrap()
    );
    let err = migrate::import(&MemoryStore::new(), &mut guard_line.as_bytes(), false)
        .await
        .unwrap_err();
    assert!(
        matches!(err, MigrateError::BadLine { line: 2, .. }),
        "{err}"
    );
    // "compressed" names JSON to compress again; with base64 it means nothing.
    let header = text
        .lines()
        .next()
        .unwrap()
        .replace("\"count\":608", "\"count\":1");
    let mixed =
        format!("{header}\n{{\"key\":\"/registry/a\",\"base64\":\"e30=\",\"compressed\":true}}\n");
    let err = migrate::import(&MemoryStore::new(), &mut mixed.as_bytes(), false)
        .await
        .unwrap_err();
    assert!(
        matches!(err, MigrateError::BadLine { line: 2, .. }),
        "{err}"
    );
}
