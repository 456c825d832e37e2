//! The fault-injection switch (`--enable-fault-injection`) against a server on the wire: it
//! cuts an open watch off, answers the next watch that names a resourceVersion with the 410
//! a client sees as Expired, adds latency to requests until cleared, is for cluster-admin
//! only, and does not exist without the flag.

mod common;

use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt;
use serde_json::{json, Value};
use setpoint_apiserver::faults::FAULTS_PATH;
use setpoint_apiserver::{ApiServer, ServerConfig};
use setpoint_runtime::client::{Client, HttpsTransport, Kubeconfig, WatchEvent};

const CONFIGMAPS: &str = "/api/v1/namespaces/default/configmaps";

async fn inject(r: &setpoint_apiserver::server::Running, request: Value) -> Value {
    let resp = post(r, FAULTS_PATH, &request).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    resp.body
}

async fn configmap(r: &setpoint_apiserver::server::Running, name: &str) -> u64 {
    let resp = post(r, CONFIGMAPS, &json!({"metadata": {"name": name}})).await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    resp.body["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// The next event of a watch within 10 s (`None`: the stream ended).
async fn next<S>(
    w: &mut S,
) -> Option<Result<WatchEvent<Value>, setpoint_runtime::client::ClientError>>
where
    S: futures::Stream<Item = Result<WatchEvent<Value>, setpoint_runtime::client::ClientError>>
        + Unpin,
{
    tokio::time::timeout(Duration::from_secs(10), w.next())
        .await
        .expect("a watch event or the end within 10 s")
}

#[tokio::test]
async fn the_switch_drops_watches_forces_410s_and_adds_latency() {
    let config = ServerConfig {
        fault_injection: true,
        ..memory_config()
    };
    let store = ApiServer::open_store(&config).await.unwrap();
    let r = ApiServer::new(config, store)
        .await
        .unwrap()
        .serve()
        .await
        .unwrap();
    let client = Client::new(
        HttpsTransport::from_kubeconfig(&Kubeconfig {
            server: r.url.clone(),
            ..Kubeconfig::default()
        })
        .unwrap(),
    );
    let rv = configmap(&r, "a").await;
    let from = |rv: u64| format!("{CONFIGMAPS}?watch=true&resourceVersion={rv}");

    // A watch open when the watches are dropped is cut off.
    let w = client.watch_raw(&from(rv)).await.unwrap();
    let mut w = Box::pin(w);
    let b = configmap(&r, "b").await;
    assert!(matches!(next(&mut w).await, Some(Ok(WatchEvent::Added(_)))));
    let state = inject(&r, json!({"dropWatches": true})).await;
    assert_eq!(state["watchesDropped"], 1, "{state}");
    match next(&mut w).await {
        None | Some(Err(_)) => {}
        Some(Ok(e)) => panic!("the dropped watch went on: {e:?}"),
    }

    // The next watch from a revision is answered 410 Expired as upstream words it; a watch
    // without one is not (upstream never expires those) and does not count.
    inject(&r, json!({"expireWatches": {"count": 1}})).await;
    let mut plain = Box::pin(
        client
            .watch_raw(&format!("{CONFIGMAPS}?watch=true"))
            .await
            .unwrap(),
    );
    assert!(matches!(
        next(&mut plain).await,
        Some(Ok(WatchEvent::Added(_)))
    ));
    drop(plain);
    let mut w = Box::pin(client.watch_raw(&from(b)).await.unwrap());
    match next(&mut w).await {
        Some(Ok(WatchEvent::Error(e))) => {
            assert_eq!((e.code, e.reason.as_str()), (410, "Expired"));
            let prefix = format!("too old resource version: {b} (");
            assert!(e.message.starts_with(&prefix), "{}", e.message);
        }
        other => panic!("not a 410: {other:?}"),
    }
    // Only one: the next watch from the same revision works.
    let mut w = Box::pin(client.watch_raw(&from(b)).await.unwrap());
    configmap(&r, "c").await;
    assert!(matches!(next(&mut w).await, Some(Ok(WatchEvent::Added(_)))));

    // Latency: every request waits it out (but the switch's own), until cleared.
    let timed = |path: &'static str| {
        let r = &r;
        async move {
            let t = Instant::now();
            assert_eq!(get(r, path).await.status, 200);
            t.elapsed()
        }
    };
    let state = inject(&r, json!({"latency": {"milliseconds": 400, "seconds": 60}})).await;
    assert_eq!(state["latencyMs"], 400, "{state}");
    assert!(timed(CONFIGMAPS).await >= Duration::from_millis(400));
    assert!(timed(FAULTS_PATH).await < Duration::from_millis(400));
    let cleared = call(&r, "DELETE", FAULTS_PATH, None, None).await;
    assert_eq!(cleared.body, json!({"watchesDropped": 0}));
    assert!(timed(CONFIGMAPS).await < Duration::from_millis(400));

    // Bad input is a 400 Status; other users than cluster-admin are refused.
    let bad = post(&r, FAULTS_PATH, &json!({"latency": {"milliseconds": 10}})).await;
    assert_eq!(
        (bad.status, bad.body["kind"].as_str()),
        (400, Some("Status"))
    );
    let alice = call_with(
        &r,
        "POST",
        FAULTS_PATH,
        Some("application/json"),
        Some(br#"{"dropWatches":true}"#.to_vec()),
        &[("Impersonate-User", "alice")],
    )
    .await;
    assert_eq!(alice.status, 403, "{}", alice.body);
}

#[tokio::test]
async fn without_the_flag_there_is_no_switch() {
    let r = start().await;
    for method in ["GET", "POST", "DELETE"] {
        let resp = call(
            &r,
            method,
            FAULTS_PATH,
            Some("application/json"),
            Some(br#"{"dropWatches":true}"#.to_vec()),
        )
        .await;
        assert_eq!(resp.status, 404, "{method}");
    }
}
