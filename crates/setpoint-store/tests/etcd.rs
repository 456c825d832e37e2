//! The etcd backend against a real etcd (`etcd` from Debian's etcd-server), started by the
//! tests on free loopback ports. Skipped with a message when etcd is not installed, unless
//! `SETPOINT_REQUIRE_ETCD` is set (CI), which makes a missing etcd a failure.
//!
//! Each test starts its own etcd: the conformance suite and the history property count
//! revisions, so they need an etcd nobody else writes to meanwhile. Stores inside one test
//! still get distinct key prefixes, the way several clusters would share one etcd.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use proptest::test_runner::{Config, TestRunner};
use setpoint_store::conformance::{
    collect_events, drain_to_progress, run_all, ConformanceOptions, DEADLINE,
};
use setpoint_store::etcd::{EtcdOptions, EtcdStore, EtcdTls, DEFAULT_ETCD_MAX_VALUE_SIZE};
use setpoint_store::{Event, Precondition, RangeRequest, Revision, Store, StoreError};

#[path = "support/etcd_server.rs"]
mod etcd_server;
#[path = "support/history.rs"]
mod history;

use etcd_server::{unique_prefix, TestEtcd, TlsFiles};
use history::{run_history, tasks, Done, History};

/// A small value limit keeps the size check quick.
const LIMIT: usize = 64 * 1024;

fn options(url: &str, prefix: &str) -> EtcdOptions {
    EtcdOptions {
        endpoints: vec![url.to_owned()],
        prefix: prefix.to_owned(),
        ..EtcdOptions::default()
    }
}

async fn connect(url: &str, prefix: &str) -> EtcdStore {
    EtcdStore::connect(options(url, prefix))
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

fn val(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_conformance() {
    let Some(etcd) = TestEtcd::start() else {
        return;
    };
    let conformance = ConformanceOptions {
        max_value_size: Some(LIMIT),
        // etcd never drops a slow watcher: it buffers for it server side (and this store
        // stops reading from etcd while its reader is behind), so there is no lag to observe.
        overflow_writes: None,
        shared_revisions: true,
    };
    let started = Instant::now();
    run_all(&conformance, || {
        let opts = EtcdOptions {
            max_value_size: LIMIT,
            ..options(&etcd.url, &unique_prefix("conformance"))
        };
        // `make` is synchronous; connecting is not.
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(EtcdStore::connect(opts))
        })
        .expect("connect")
    })
    .await;
    eprintln!(
        "conformance suite against etcd passed in {:?}",
        started.elapsed()
    );
}

/// The history property (see `support/history.rs`) against etcd: one etcd, a fresh prefix
/// per case.
#[test]
fn etcd_history_is_consistent() {
    let Some(etcd) = TestEtcd::start() else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let cases = std::env::var("SETPOINT_ETCD_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32);
    let mut runner = TestRunner::new(Config {
        cases,
        max_shrink_iters: 16,
        ..Config::default()
    });
    let strategy = (tasks(30), tasks(10), 0.0..=1.0f64);
    let result = runner.run(&strategy, |(phase1, phase2, cut)| {
        runtime.block_on(async {
            let store: Arc<dyn Store> =
                Arc::new(connect(&etcd.url, &unique_prefix("history")).await);
            run_history(&store, phase1, phase2, cut).await;
            store.close().await.unwrap();
        });
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// Writers on two connections, watchers on a third: every watcher, live or started from the
/// past, sees exactly the committed writes under its prefix, in commit order, with the right
/// previous values; revisions have no gaps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_order_across_connections() {
    let Some(etcd) = TestEtcd::start() else {
        return;
    };
    let prefix = unique_prefix("order");
    let writers: Vec<Arc<dyn Store>> = vec![
        Arc::new(connect(&etcd.url, &prefix).await),
        Arc::new(connect(&etcd.url, &prefix).await),
    ];
    let reader = connect(&etcd.url, &prefix).await;
    let base = reader.current_revision().await.unwrap();
    let mut all = reader.watch("", base).await.unwrap();
    let mut one = reader.watch("/o/1", base).await.unwrap();

    let keys = ["/o/0", "/o/1", "/o/2", "/p/0"];
    let tasks_n = 4;
    let writes = 40;
    let handles: Vec<_> = (0..tasks_n)
        .map(|t| {
            let store = writers[t % 2].clone();
            tokio::spawn(async move {
                let mut done = Vec::new();
                for i in 0..writes {
                    let key = keys[(t * 7 + i * 3) % keys.len()];
                    if i % 5 == 4 {
                        match store.delete(key, Precondition::None).await {
                            Ok((prev, revision)) => done.push(Done::Delete {
                                key: key.to_owned(),
                                prev,
                                revision,
                            }),
                            Err(StoreError::NotFound { .. }) => {}
                            Err(e) => panic!("delete: {e}"),
                        }
                    } else {
                        let kv = store
                            .put(key, val(&format!("{t}-{i}")), Precondition::None)
                            .await
                            .unwrap();
                        done.push(Done::Put(kv));
                    }
                }
                done
            })
        })
        .collect();
    let mut done = Vec::new();
    for h in handles {
        done.extend(h.await.unwrap());
    }
    let mut history = History::new(base);
    // Checks that the reported revisions are exactly base+1..=current with no gaps.
    history.extend(done);
    let current = reader.current_revision().await.unwrap();
    assert_eq!(current, history.current());

    let expected_all = history.suffix("", base);
    assert_eq!(
        collect_events(&mut all, expected_all.len()).await,
        expected_all
    );
    let expected_one = history.suffix("/o/1", base);
    assert_eq!(
        collect_events(&mut one, expected_one.len()).await,
        expected_one
    );
    // A watch started from the middle replays exactly the rest.
    let mid = base + (current - base) / 2;
    let mut late = reader.watch("/o/", mid).await.unwrap();
    assert_eq!(
        drain_to_progress(&reader, &mut late).await,
        history.suffix("/o/", mid)
    );
    assert!(drain_to_progress(&reader, &mut all).await.is_empty());
}

/// Stores under different prefixes share one etcd without seeing each other; keys in etcd
/// are the prefix plus the store's key, and the store never shows the prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefixes_isolate_clusters() {
    let Some(etcd) = TestEtcd::start() else {
        return;
    };
    let a = connect(&etcd.url, "/cluster-a").await;
    let b = connect(&etcd.url, "/cluster-b").await;
    let start = a.current_revision().await.unwrap();
    let mut watch_b = b.watch("/registry/", start).await.unwrap();
    let kv = a
        .put("/registry/x", val("a"), Precondition::NotExists)
        .await
        .unwrap();
    assert_eq!(&*kv.key, "/registry/x");
    assert_eq!(b.get("/registry/x").await.unwrap(), None);
    b.put("/registry/x", val("b"), Precondition::NotExists)
        .await
        .unwrap();
    let listed = a.range(RangeRequest::default()).await.unwrap();
    assert_eq!(listed.kvs.len(), 1);
    assert_eq!(&*listed.kvs[0].key, "/registry/x");
    assert_eq!(listed.kvs[0].value, val("a"));
    let events = drain_to_progress(&b, &mut watch_b).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].key(), "/registry/x");

    // The raw etcd key carries the prefix.
    let channel = tonic::transport::Endpoint::from_shared(etcd.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let stored = setpoint_etcd_proto::kv_client::KvClient::new(channel)
        .range(setpoint_etcd_proto::RangeRequest {
            key: b"/cluster-a/registry/x".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .kvs
        .first()
        .map(|kv| kv.value.clone());
    assert_eq!(stored, Some(b"a".to_vec()));
}

/// With etcd's default request limit: a value over `max_value_size` is refused before it is
/// sent; one that etcd itself refuses (the limit counts the key too) is `TooLarge` as well;
/// a large value that fits comes back whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn value_size_limit_is_a_clear_error() {
    let Some(etcd) = TestEtcd::start() else {
        return;
    };
    let store = connect(&etcd.url, &unique_prefix("size")).await;
    let over = Bytes::from(vec![b'x'; DEFAULT_ETCD_MAX_VALUE_SIZE + 1]);
    match store.put("/big", over, Precondition::None).await {
        Err(StoreError::TooLarge { size, limit }) => {
            assert_eq!(
                (size, limit),
                (DEFAULT_ETCD_MAX_VALUE_SIZE + 1, DEFAULT_ETCD_MAX_VALUE_SIZE)
            )
        }
        other => panic!("oversized put: {other:?}"),
    }
    let at_limit = Bytes::from(vec![b'y'; DEFAULT_ETCD_MAX_VALUE_SIZE]);
    match store.put("/big", at_limit, Precondition::NotExists).await {
        Err(StoreError::TooLarge { size, limit }) => {
            assert_eq!(size, DEFAULT_ETCD_MAX_VALUE_SIZE);
            assert!(limit < size);
        }
        other => panic!("a put etcd refuses must be TooLarge: {other:?}"),
    }
    let fits = Bytes::from(vec![b'z'; 1024 * 1024]);
    store
        .put("/big", fits.clone(), Precondition::None)
        .await
        .unwrap();
    assert_eq!(store.get("/big").await.unwrap().unwrap().value, fits);
    assert_eq!(store.get("/none").await.unwrap(), None);
}

/// `close` ends watch streams and refuses later calls; losing etcd ends a watch with an error
/// item, then the end of the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_and_etcd_loss_end_watches() {
    let Some(mut etcd) = TestEtcd::start() else {
        return;
    };
    let store = connect(&etcd.url, &unique_prefix("close")).await;
    store.put("/a", val("1"), Precondition::None).await.unwrap();
    let rev = store.current_revision().await.unwrap();
    let mut watch = store.watch("/", rev).await.unwrap();
    store.close().await.unwrap();
    let next = tokio::time::timeout(DEADLINE, watch.next()).await.unwrap();
    assert!(next.is_none(), "expected the end of the stream: {next:?}");
    assert!(matches!(store.get("/a").await, Err(StoreError::Closed)));
    assert!(matches!(
        store.put("/a", val("2"), Precondition::None).await,
        Err(StoreError::Closed)
    ));
    assert!(matches!(
        store.watch("/", rev).await,
        Err(StoreError::Closed)
    ));

    let store = connect(&etcd.url, &unique_prefix("loss")).await;
    let mut watch = store.watch("/", rev).await.unwrap();
    etcd.kill();
    let first = tokio::time::timeout(DEADLINE, watch.next()).await.unwrap();
    assert!(
        matches!(first, Some(Err(StoreError::Backend(_)))),
        "losing etcd must end the watch with an error: {first:?}"
    );
    let end = tokio::time::timeout(DEADLINE, watch.next()).await.unwrap();
    assert!(end.is_none(), "the error is the last item: {end:?}");
}

/// A watch that asks for progress right after starting a replay gets the replayed events
/// first (etcd before 3.4.31 would send the notification ahead of them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_after_replay_is_in_order() {
    let Some(etcd) = TestEtcd::start() else {
        return;
    };
    let store = connect(&etcd.url, &unique_prefix("progress")).await;
    let base = store.current_revision().await.unwrap();
    let mut expected = Vec::new();
    for i in 0..20 {
        let kv = store
            .put(
                &format!("/r/{}", i % 3),
                val(&i.to_string()),
                Precondition::None,
            )
            .await
            .unwrap();
        expected.push(kv.mod_revision);
    }
    for _ in 0..3 {
        let mut watch = store.watch("/r/", base).await.unwrap();
        let events = drain_to_progress(&store, &mut watch).await;
        let seen: Vec<Revision> = events.iter().map(Event::revision).collect();
        assert_eq!(seen, expected);
    }
}

/// Connects over TLS with a client certificate; without one etcd refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_client_certificates() {
    if !etcd_server::etcd_available() {
        return;
    }
    let pki = tempfile::tempdir().unwrap();
    let certs = make_certs();
    let files = TlsFiles {
        ca: pki.path().join("ca.crt"),
        server_cert: pki.path().join("server.crt"),
        server_key: pki.path().join("server.key"),
    };
    std::fs::write(&files.ca, &certs.ca).unwrap();
    std::fs::write(&files.server_cert, &certs.server_cert).unwrap();
    std::fs::write(&files.server_key, &certs.server_key).unwrap();
    let Some(etcd) = TestEtcd::start_tls(&files) else {
        return;
    };
    let tls = EtcdTls {
        ca_pem: certs.ca.clone().into_bytes(),
        cert_pem: Some(certs.client_cert.clone().into_bytes()),
        key_pem: Some(certs.client_key.clone().into_bytes()),
    };
    let store = EtcdStore::connect(EtcdOptions {
        tls: Some(tls.clone()),
        ..options(&etcd.url, &unique_prefix("tls"))
    })
    .await
    .expect("TLS connect");
    let kv = store
        .put("/k", val("v"), Precondition::NotExists)
        .await
        .unwrap();
    assert_eq!(store.get("/k").await.unwrap(), Some(kv));

    let no_client_cert = EtcdStore::connect(EtcdOptions {
        tls: Some(EtcdTls {
            cert_pem: None,
            key_pem: None,
            ..tls
        }),
        dial_timeout: Duration::from_secs(3),
        ..options(&etcd.url, "/x")
    })
    .await;
    assert!(
        no_client_cert.is_err(),
        "etcd requires a client certificate"
    );
}

struct Certs {
    ca: String,
    server_cert: String,
    server_key: String,
    client_cert: String,
    client_key: String,
}

fn make_certs() -> Certs {
    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
        SanType,
    };
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::from_params(&ca_params, &ca_key);
    let leaf = |usage: ExtendedKeyUsagePurpose| {
        let mut p = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        p.subject_alt_names
            .push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
        p.extended_key_usages = vec![usage];
        let key = KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = leaf(ExtendedKeyUsagePurpose::ServerAuth);
    let (client_cert, client_key) = leaf(ExtendedKeyUsagePurpose::ClientAuth);
    Certs {
        ca: ca.pem(),
        server_cert,
        server_key,
        client_cert,
        client_key,
    }
}

/// How soon a write acknowledged on one connection reaches a live watch on another (two API
/// servers sharing etcd): printed, and bounded generously.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_connection_watch_latency() {
    let Some(etcd) = TestEtcd::start() else {
        return;
    };
    let prefix = unique_prefix("latency");
    let writer = connect(&etcd.url, &prefix).await;
    let reader = connect(&etcd.url, &prefix).await;
    let start = reader.current_revision().await.unwrap();
    let mut watch = reader.watch("/l/", start).await.unwrap();
    // Stamp each event as it arrives, so the measurement does not depend on which of the
    // put's answer and the event this task looks at first.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(resp)) = watch.next().await {
            for e in resp.events {
                let _ = tx.send((e.revision(), Instant::now()));
            }
        }
    });
    let mut latencies = Vec::new();
    let mut round_trips = Vec::new();
    for i in 0..50 {
        let sent = Instant::now();
        let kv = writer
            .put("/l/k", val(&i.to_string()), Precondition::None)
            .await
            .unwrap();
        round_trips.push(sent.elapsed());
        let (revision, seen) = tokio::time::timeout(DEADLINE, rx.recv())
            .await
            .expect("event within the deadline")
            .expect("watch alive");
        assert_eq!(revision, kv.mod_revision);
        latencies.push(seen - sent);
    }
    latencies.sort();
    round_trips.sort();
    let median = latencies[latencies.len() / 2];
    let max = latencies[latencies.len() - 1];
    eprintln!(
        "put sent -> event on another connection: median {median:?}, max {max:?} \
         (put round trip: median {:?})",
        round_trips[round_trips.len() / 2]
    );
    assert!(max < Duration::from_secs(2), "watch delivery took {max:?}");
}
