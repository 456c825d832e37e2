//! `/livez`, `/readyz`, `/healthz`, `/version` and `/metrics` as kube-apiserver answers them:
//! health is `ok`, or with
//! `?verbose` one line per check; `?exclude=` and `/<endpoint>/<check>`.

mod common;

use common::*;

#[tokio::test]
async fn health_endpoints_list_their_checks() {
    let r = start().await;
    for endpoint in ["/livez", "/readyz", "/healthz"] {
        let plain = get(&r, endpoint).await;
        assert_eq!(plain.status, 200);
        assert_eq!(plain.raw, "ok");
    }
    let livez = get(&r, "/livez?verbose").await;
    assert_eq!(livez.status, 200);
    assert_eq!(
        std::str::from_utf8(&livez.raw).unwrap(),
        "[+]ping ok\n[+]etcd ok\nlivez check passed\n"
    );
    let readyz = get(&r, "/readyz?verbose").await;
    assert_eq!(
        std::str::from_utf8(&readyz.raw).unwrap(),
        "[+]ping ok\n[+]etcd ok\n[+]informer-sync ok\n[+]shutdown ok\nreadyz check passed\n"
    );
    let excluded = get(&r, "/readyz?verbose&exclude=etcd&exclude=nothing").await;
    assert_eq!(
        std::str::from_utf8(&excluded.raw).unwrap(),
        "[+]ping ok\n[+]etcd excluded: ok\n[+]informer-sync ok\n[+]shutdown ok\n\
         warn: some health checks cannot be excluded: no matches for \"nothing\"\n\
         readyz check passed\n"
    );
    let one = get(&r, "/readyz/etcd").await;
    assert_eq!((one.status, one.raw.as_ref()), (200, b"ok".as_ref()));
    let one = get(&r, "/livez/ping").await;
    assert_eq!((one.status, one.raw.as_ref()), (200, b"ok".as_ref()));
}

/// `/version` names the commit the server was built from and when.
#[tokio::test]
async fn version_has_the_build() {
    let r = start().await;
    let v = get(&r, "/version").await.body;
    assert_eq!(
        (v["major"].as_str(), v["minor"].as_str()),
        (Some("1"), Some("32"))
    );
    let commit = v["gitCommit"].as_str().unwrap();
    // Built from a git checkout (the repository's tests always are): a full commit id.
    assert!(
        commit.len() == 40 && commit.bytes().all(|c| c.is_ascii_hexdigit()),
        "{commit:?}"
    );
    let date = v["buildDate"].as_str().unwrap();
    let parsed = chrono::DateTime::parse_from_rfc3339(date).unwrap();
    assert!(parsed.timestamp() > 1_700_000_000, "{date}");
}

/// `/metrics` in Prometheus' text format (a counter named by its samples), or OpenMetrics
/// when the scraper asks for it.
#[tokio::test]
async fn metrics_in_either_text_format() {
    let r = start().await;
    get(&r, "/api/v1/namespaces").await;
    let classic = get(&r, "/metrics").await;
    assert_eq!(
        classic.headers["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let text = std::str::from_utf8(&classic.raw).unwrap();
    assert!(
        text.contains("# TYPE apiserver_request_total counter\n"),
        "{text}"
    );
    assert!(text.contains("\napiserver_request_total{"), "{text}");
    assert!(!text.contains("# EOF"), "{text}");
    let om = call_with(
        &r,
        "GET",
        "/metrics",
        None,
        None,
        &[("accept", "application/openmetrics-text;version=1.0.0")],
    )
    .await;
    assert!(om.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/openmetrics-text"));
    let text = std::str::from_utf8(&om.raw).unwrap();
    assert!(
        text.contains("# TYPE apiserver_request counter\n"),
        "{text}"
    );
    assert!(text.ends_with("# EOF\n"), "{text}");
}
