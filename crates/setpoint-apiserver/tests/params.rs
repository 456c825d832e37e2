//! Query parameters as upstream reads them (a value that does not parse is upstream's 400, a
//! forbidden combination its 422), reads from a future `resourceVersion`, `fieldManager`
//! validation, and watch buffers bounded in bytes.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use setpoint_apiserver::server::Running;
use setpoint_apiserver::watchcache::CacheConfig;
use setpoint_apiserver::StoreConfig;
use tokio::io::AsyncWriteExt;

const CMS: &str = "/api/v1/namespaces/default/configmaps";

fn configmap(name: &str, data: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": data}})
}

fn assert_status(r: &Resp, code: u16, reason: &str, message: &str) {
    assert_eq!(r.status, code, "{}", r.body);
    assert_eq!(r.body["kind"], "Status", "{}", r.body);
    assert_eq!(r.body["code"], code, "{}", r.body);
    assert_eq!(r.body["reason"], reason, "{}", r.body);
    assert_eq!(r.body["message"], message, "{}", r.body);
}

/// The events of a finished watch body.
fn events(raw: &[u8]) -> Vec<Value> {
    raw.split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).expect("an event is JSON"))
        .collect()
}

#[tokio::test]
async fn timeout_seconds_that_do_not_parse_are_400_and_a_negative_one_ends_the_watch() {
    let r = start().await;
    for (value, why) in [
        ("abc", "invalid syntax"),
        ("99999999999999999999", "value out of range"),
        ("1.5", "invalid syntax"),
    ] {
        let resp = get(&r, &format!("{CMS}?watch=true&timeoutSeconds={value}")).await;
        assert_status(
            &resp,
            400,
            "BadRequest",
            &format!("strconv.ParseInt: parsing \"{value}\": {why}"),
        );
    }
    // Upstream runs the watch under a deadline already past: it answers 200 and ends.
    post(&r, CMS, &configmap("a", "1")).await;
    let resp = get(&r, &format!("{CMS}?watch=true&timeoutSeconds=-1")).await;
    assert_eq!(resp.status, 200);
    assert!(resp.raw.is_empty(), "{:?}", resp.raw);
}

#[tokio::test]
async fn bad_numbers_and_enumerations_are_upstreams_errors() {
    let r = start().await;
    post(&r, CMS, &configmap("a", "1")).await;
    let resp = get(&r, &format!("{CMS}?limit=abc")).await;
    assert_status(
        &resp,
        400,
        "BadRequest",
        "strconv.ParseInt: parsing \"abc\": invalid syntax",
    );
    let resp = get(
        &r,
        &format!("{CMS}?resourceVersion=1&resourceVersionMatch=Bogus"),
    )
    .await;
    assert_status(
        &resp,
        422,
        "Invalid",
        "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Unsupported value: \"Bogus\": supported values: \"Exact\", \"NotOlderThan\", \"\"",
    );
    assert_eq!(resp.body["details"]["kind"], "ListOptions");
    assert_eq!(resp.body["details"]["group"], "meta.k8s.io");
    assert_eq!(
        resp.body["details"]["causes"][0]["reason"],
        "FieldValueNotSupported"
    );
    let resp = get(&r, &format!("{CMS}?sendInitialEvents=true")).await;
    assert_status(
        &resp,
        422,
        "Invalid",
        "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list",
    );
    let resp = get(&r, &format!("{CMS}?watch=1&sendInitialEvents=true")).await;
    assert_status(
        &resp,
        422,
        "Invalid",
        "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
    );
    let resp = get(&r, &format!("{CMS}?resourceVersion=abc")).await;
    assert_status(
        &resp,
        400,
        "BadRequest",
        "resourceVersion: Invalid value: \"abc\": strconv.ParseUint: parsing \"abc\": invalid syntax",
    );
    let resp = get(&r, &format!("{CMS}?watch=1&resourceVersion=-3")).await;
    assert_status(
        &resp,
        400,
        "BadRequest",
        "resourceVersion: Invalid value: \"-3\": strconv.ParseUint: parsing \"-3\": invalid syntax",
    );
    let resp = get(&r, &format!("{CMS}/a?resourceVersion=x1")).await;
    assert_status(
        &resp,
        400,
        "BadRequest",
        "resourceVersion: Invalid value: \"x1\": strconv.ParseUint: parsing \"x1\": invalid syntax",
    );

    // Table options.
    let table = [("accept", "application/json;as=Table;v=v1;g=meta.k8s.io")];
    let resp = call_with(
        &r,
        "GET",
        &format!("{CMS}?includeObject=Bogus"),
        None,
        None,
        &table,
    )
    .await;
    assert_status(
        &resp,
        400,
        "BadRequest",
        "Unable to convert to Table as requested: includeObject: Invalid value: \"Bogus\": must be 'Metadata', 'Object', 'None', or empty",
    );
    let resp = call_with(
        &r,
        "GET",
        &format!("{CMS}?includeObject=Object"),
        None,
        None,
        &table,
    )
    .await;
    assert_eq!(resp.body["kind"], "Table", "{}", resp.body);
    assert_eq!(resp.body["rows"][0]["object"]["kind"], "ConfigMap");

    // Write options.
    let resp = call(
        &r,
        "POST",
        &format!("{CMS}?dryRun=Bogus"),
        Some("application/json"),
        Some(serde_json::to_vec(&configmap("b", "1")).unwrap()),
    )
    .await;
    assert_status(
        &resp,
        422,
        "Invalid",
        "CreateOptions.meta.k8s.io \"\" is invalid: dryRun: Unsupported value: []string{\"Bogus\"}: supported values: \"All\"",
    );
    let resp = call(
        &r,
        "PUT",
        &format!("{CMS}/a?fieldValidation=Bogus"),
        Some("application/json"),
        Some(serde_json::to_vec(&configmap("a", "2")).unwrap()),
    )
    .await;
    assert_status(
        &resp,
        422,
        "Invalid",
        "UpdateOptions.meta.k8s.io \"\" is invalid: fieldValidation: Unsupported value: \"Bogus\": supported values: \"\", \"Ignore\", \"Strict\", \"Warn\"",
    );
    // `force` is a pointer upstream: a non-apply patch may not give it, whatever its value.
    for value in ["maybe", "false"] {
        let resp = call(
            &r,
            "PATCH",
            &format!("{CMS}/a?force={value}"),
            Some("application/merge-patch+json"),
            Some(br#"{"data":{"k":"3"}}"#.to_vec()),
        )
        .await;
        assert_status(
            &resp,
            422,
            "Invalid",
            "PatchOptions.meta.k8s.io \"\" is invalid: force: Forbidden: may not be specified for non-apply patch",
        );
    }

    // Delete options.
    let resp = delete(&r, &format!("{CMS}/a?gracePeriodSeconds=soon")).await;
    assert_status(
        &resp,
        400,
        "BadRequest",
        "strconv.ParseInt: parsing \"soon\": invalid syntax",
    );
    let resp = delete(&r, &format!("{CMS}/a?propagationPolicy=Bogus")).await;
    assert_status(
        &resp,
        422,
        "Invalid",
        "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Unsupported value: \"Bogus\": supported values: \"Foreground\", \"Background\", \"Orphan\", \"nil\"",
    );
    let resp = delete(
        &r,
        &format!("{CMS}/a?propagationPolicy=Background&orphanDependents=false"),
    )
    .await;
    assert_status(
        &resp,
        422,
        "Invalid",
        "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Invalid value: \"Background\": orphanDependents and deletionPropagation cannot be both set",
    );
    // Nothing was deleted by the rejected requests.
    assert_eq!(get(&r, &format!("{CMS}/a")).await.status, 200);
}

/// Booleans read as upstream's query conversion reads them: only absent, `0` and `false`
/// are false, so `watch=maybe` is a watch and `allowWatchBookmarks=maybe` asks for bookmarks.
#[tokio::test]
async fn any_boolean_but_false_or_0_is_true() {
    let r = start().await;
    post(&r, CMS, &configmap("a", "1")).await;
    let resp = get(&r, &format!("{CMS}?watch=maybe&timeoutSeconds=1")).await;
    assert_eq!(resp.status, 200);
    let evs = events(&resp.raw);
    assert_eq!(evs.len(), 1, "{evs:?}");
    assert_eq!(evs[0]["type"], "ADDED");
    assert_eq!(evs[0]["object"]["metadata"]["name"], "a");
    let list = get(&r, &format!("{CMS}?watch=False")).await;
    assert_eq!(list.body["kind"], "ConfigMapList", "{}", list.body);
    let resp = get(
        &r,
        &format!("{CMS}?watch=1&allowWatchBookmarks=maybe&sendInitialEvents=yes&resourceVersionMatch=NotOlderThan&timeoutSeconds=1"),
    )
    .await;
    let evs = events(&resp.raw);
    assert_eq!(evs.len(), 2, "{evs:?}");
    assert_eq!(evs[1]["type"], "BOOKMARK");
    assert_eq!(
        evs[1]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
}

/// A read from a revision the server has not reached waits for its cache a few seconds, then
/// is upstream's 504 `Too large resource version`: a GET and a LIST answer it, a WATCH sends it
/// as its ERROR event.
#[tokio::test]
async fn reads_from_a_future_resource_version_are_too_large_after_waiting() {
    let r = start().await;
    let created = post(&r, CMS, &configmap("a", "1")).await;
    let current: u64 = created.body["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let future = current + 1_000_000;
    let started = std::time::Instant::now();
    let (get_path, list_path, watch_path) = (
        format!("{CMS}/a?resourceVersion={future}"),
        format!("{CMS}?resourceVersion={future}"),
        format!("{CMS}?watch=1&resourceVersion={future}"),
    );
    let (got, listed, watched) = tokio::join!(
        get(&r, &get_path),
        get(&r, &list_path),
        get(&r, &watch_path),
    );
    // The cache was given time to catch up.
    assert!(started.elapsed() >= Duration::from_secs(2));
    let check = |status: &Value| {
        assert_eq!(status["code"], 504, "{status}");
        assert_eq!(status["reason"], "Timeout", "{status}");
        let message = status["message"].as_str().unwrap();
        let prefix = format!("Timeout: Too large resource version: {future}, current: ");
        let rest = message.strip_prefix(&prefix).expect(message);
        assert!(rest.parse::<u64>().unwrap() >= current, "{message}");
        assert_eq!(
            status["details"]["causes"][0]["reason"],
            "ResourceVersionTooLarge"
        );
        assert_eq!(
            status["details"]["causes"][0]["message"],
            "Too large resource version"
        );
        assert!(status["details"]["causes"][0].get("field").is_none());
        assert_eq!(status["details"]["retryAfterSeconds"], 1);
    };
    assert_eq!(got.status, 504);
    assert_eq!(got.headers["retry-after"], "1");
    check(&got.body);
    assert_eq!(listed.status, 504);
    check(&listed.body);
    assert_eq!(watched.status, 200);
    let evs = events(&watched.raw);
    assert_eq!(evs.len(), 1, "{evs:?}");
    assert_eq!(evs[0]["type"], "ERROR");
    check(&evs[0]["object"]);

    // An exact read is served by the store, which answers a future revision the same way.
    let exact = get(
        &r,
        &format!("{CMS}?resourceVersion={future}&resourceVersionMatch=Exact"),
    )
    .await;
    assert_eq!(exact.status, 504, "{}", exact.body);
    check(&exact.body);

    // A revision the server has reached is served at once.
    let ok = get(&r, &format!("{CMS}/a?resourceVersion={current}")).await;
    assert_eq!(ok.status, 200, "{}", ok.body);
}

#[tokio::test]
async fn field_managers_must_be_short_and_printable() {
    let r = start().await;
    let long = "m".repeat(129);
    let body = serde_json::to_vec(&configmap("a", "1")).unwrap();
    let resp = call(
        &r,
        "POST",
        &format!("{CMS}?fieldManager={long}"),
        Some("application/json"),
        Some(body.clone()),
    )
    .await;
    assert_status(
        &resp,
        422,
        "Invalid",
        "CreateOptions.meta.k8s.io \"\" is invalid: fieldManager: Too long: may not be more than 128 bytes",
    );
    let cause = &resp.body["details"]["causes"][0];
    assert_eq!(cause["reason"], "FieldValueTooLong");
    assert_eq!(cause["field"], "fieldManager");
    let resp = call(
        &r,
        "POST",
        &format!("{CMS}?fieldManager=a%00b"),
        Some("application/json"),
        Some(body.clone()),
    )
    .await;
    assert_status(
        &resp,
        422,
        "Invalid",
        "CreateOptions.meta.k8s.io \"\" is invalid: fieldManager: Invalid value: \"a\\x00b\": invalid character U+0000 (at position 1)",
    );
    assert_eq!(
        resp.body["details"]["causes"][0]["reason"],
        "FieldValueInvalid"
    );
    assert_eq!(get(&r, &format!("{CMS}/a")).await.status, 404);

    // 128 printable characters are fine.
    let ok = "m".repeat(128);
    let resp = call(
        &r,
        "POST",
        &format!("{CMS}?fieldManager={ok}"),
        Some("application/json"),
        Some(body),
    )
    .await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    assert_eq!(resp.body["metadata"]["managedFields"][0]["manager"], ok);

    let resp = call(
        &r,
        "PUT",
        &format!("{CMS}/a?fieldManager=x%0Ay"),
        Some("application/json"),
        Some(serde_json::to_vec(&configmap("a", "2")).unwrap()),
    )
    .await;
    assert_status(
        &resp,
        422,
        "Invalid",
        "UpdateOptions.meta.k8s.io \"\" is invalid: fieldManager: Invalid value: \"x\\ny\": invalid character U+000A (at position 1)",
    );
    let resp = call(
        &r,
        "PATCH",
        &format!("{CMS}/a?fieldManager={long}&force=true"),
        Some("application/apply-patch+yaml"),
        Some(serde_json::to_vec(&configmap("a", "3")).unwrap()),
    )
    .await;
    assert_status(
        &resp,
        422,
        "Invalid",
        "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Too long: may not be more than 128 bytes",
    );
    let kept = get(&r, &format!("{CMS}/a")).await;
    assert_eq!(kept.body["data"]["k"], "1");
}

/// The value of a Prometheus sample of the server's `/metrics` (0 when absent).
async fn metric(r: &Running, sample: &str) -> f64 {
    let text = String::from_utf8(get(r, "/metrics").await.raw.to_vec()).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(sample)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Opens a watch on a connection that is never read, with a small receive buffer so the
/// kernel does not absorb much of what the server sends.
async fn unread_watch(r: &Running, path: &str) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(r.addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nhost: localhost\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    stream
}

/// A watcher that never reads is ended once what is queued for it passes its byte budget,
/// while a watcher that reads gets every event, and a watch whose initial list is many times
/// the budget still delivers all of it to a client that reads.
#[tokio::test]
async fn a_watcher_that_falls_behind_its_byte_budget_is_dropped_and_a_reader_gets_everything() {
    const BUDGET: usize = 256 << 10;
    let r = start_with(
        StoreConfig::Memory,
        CacheConfig {
            watcher_buffer_bytes: BUDGET,
            ..CacheConfig::default()
        },
    )
    .await;
    let dropped = "apiserver_watchers_dropped_total{resource=\"configmaps\"}";
    let registered = "apiserver_registered_watchers{resource=\"configmaps\"}";
    let _stalled = unread_watch(&r, &format!("{CMS}?watch=true")).await;
    let (status, mut reader) = WatchStream::open(&r, &format!("{CMS}?watch=true")).await;
    assert_eq!(status, 200);
    setpoint_testing::eventually_within(Duration::from_secs(10), "two watchers", || async {
        (metric(&r, registered).await == 2.0).then_some(())
    })
    .await;

    // 64 KiB objects, 300 of them: about 19 MiB, many times the budget and more than the
    // kernel and the connection buffer between the server and the stalled client.
    let blob = "x".repeat(64 << 10);
    let writes = 300;
    let mut last_rv = String::new();
    for i in 0..writes {
        let c = post(&r, CMS, &configmap(&format!("c{i:03}"), &blob)).await;
        assert_eq!(c.status, 201, "{}", c.body);
        last_rv = c.body["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string();
        // Keep the reader's own queue within the budget by reading as the writes happen.
        let ev = reader.next().await.expect("an event");
        assert_eq!(ev["type"], "ADDED");
        assert_eq!(ev["object"]["metadata"]["name"], format!("c{i:03}"));
    }
    setpoint_testing::eventually_within(
        Duration::from_secs(10),
        "the stalled watcher to be dropped",
        || async { (metric(&r, dropped).await >= 1.0).then_some(()) },
    )
    .await;
    assert_eq!(metric(&r, dropped).await, 1.0, "only the stalled one");
    assert_eq!(metric(&r, registered).await, 1.0);

    // The initial list of a watch is many times the budget, and all of it arrives.
    let (status, mut full) = WatchStream::open(
        &r,
        &format!("{CMS}?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"),
    )
    .await;
    assert_eq!(status, 200);
    for i in 0..writes {
        let ev = full.next().await.expect("an initial event");
        assert_eq!(ev["type"], "ADDED");
        assert_eq!(ev["object"]["metadata"]["name"], format!("c{i:03}"));
    }
    let end = full.next().await.expect("the end of the initial events");
    assert_eq!(end["type"], "BOOKMARK");
    assert_eq!(
        end["object"]["metadata"]["resourceVersion"],
        last_rv.as_str()
    );
}
