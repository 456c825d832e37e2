//! The connection layer against raw TCP and TLS clients: every stage of reading a request is
//! timed out (the TLS handshake, the head, the body, an idle keep-alive connection), a watch is
//! not, and what the HTTP layer refuses (a malformed chunked body, a long URI, a huge header,
//! a malformed request line) is answered with a `Status`.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use setpoint_apiserver::server::{ConnectionConfig, Running};
use setpoint_apiserver::{ApiServer, ServerConfig, StoreConfig};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The short timeout every test configures for the stage it exercises.
const SHORT: Duration = Duration::from_millis(300);
/// A timeout long enough never to fire during a test.
const LONG: Duration = Duration::from_secs(60);
/// How long a test waits for the server to act before it fails.
const DEADLINE: Duration = Duration::from_secs(10);

async fn start(connection: ConnectionConfig, tls: bool) -> Running {
    let config = ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        insecure_http: !tls,
        store: StoreConfig::Memory,
        connection,
        ..ServerConfig::default()
    };
    let store = ApiServer::open_store(&config).await.unwrap();
    let server = ApiServer::new(config, store).await.unwrap();
    server.serve().await.unwrap()
}

/// Every timeout long, except those the test sets.
fn long_timeouts() -> ConnectionConfig {
    ConnectionConfig {
        tls_handshake_timeout: LONG,
        header_read_timeout: LONG,
        idle_timeout: LONG,
        body_read_timeout: LONG,
        ..ConnectionConfig::default()
    }
}

/// Reads until the server closes the connection (a reset or a TLS stream ended without
/// `close_notify` count as closed too); returns what was read and when it ended. Fails if the
/// server keeps the connection open past [`DEADLINE`].
async fn read_until_closed<R: AsyncRead + Unpin>(r: &mut R) -> (Vec<u8>, Instant) {
    let mut out = Vec::new();
    let read = async {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(DEADLINE, read)
        .await
        .expect("the server closes the connection in time");
    (out, Instant::now())
}

/// A raw HTTP/1.1 response: status code, header lines (lowercased names) and body.
struct RawResponse {
    code: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl RawResponse {
    /// Parses the first response in `bytes` (bodies framed by Content-Length, as the server
    /// sends its `Status` answers).
    fn parse(bytes: &[u8]) -> RawResponse {
        let text = String::from_utf8_lossy(bytes);
        let end = text.find("\r\n\r\n").expect("a complete response head");
        let mut lines = text[..end].split("\r\n");
        let status = lines.next().unwrap();
        let code = status.split(' ').nth(1).unwrap().parse().unwrap();
        let headers: Vec<(String, String)> = lines
            .map(|l| {
                let (k, v) = l.split_once(':').unwrap();
                (k.trim().to_ascii_lowercase(), v.trim().to_string())
            })
            .collect();
        let rest = &bytes[end + 4..];
        let len = headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .map(|(_, v)| v.parse::<usize>().unwrap())
            .unwrap_or(rest.len());
        RawResponse {
            code,
            headers,
            body: rest[..len].to_vec(),
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn status(&self) -> Value {
        assert_eq!(self.header("content-type"), Some("application/json"));
        serde_json::from_slice(&self.body).expect("a JSON body")
    }
}

/// Checks a `Status` body's fixed fields and returns it.
fn assert_status(resp: &RawResponse, code: u16, reason: &str) -> Value {
    assert_eq!(resp.code, code);
    let status = resp.status();
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["apiVersion"], "v1");
    assert_eq!(status["status"], "Failure");
    assert_eq!(status["code"], code);
    assert_eq!(status["reason"], reason);
    assert!(
        status["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{status}"
    );
    status
}

fn tls_connector(running: &Running) -> tokio_rustls::TlsConnector {
    tokio_rustls::TlsConnector::from(tls_client_config(running))
}

/// A TLS client that trusts the server's CA and presents no certificate.
fn tls_client_config(running: &Running) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    let pki = running.pki.as_ref().expect("an HTTPS server");
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(pki.ca_cert.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    Arc::new(config)
}

#[tokio::test]
async fn a_connection_that_never_starts_tls_is_closed_after_the_handshake_timeout() {
    let running = start(
        ConnectionConfig {
            tls_handshake_timeout: SHORT,
            ..long_timeouts()
        },
        true,
    )
    .await;
    let start = Instant::now();
    let mut tcp = TcpStream::connect(running.addr).await.unwrap();
    let (bytes, closed) = read_until_closed(&mut tcp).await;
    assert!(bytes.is_empty(), "nothing is sent before a ClientHello");
    assert!(closed - start >= SHORT, "closed by the handshake timeout");
    running.shutdown().await;
}

#[tokio::test]
async fn a_tls_connection_without_a_request_is_closed_after_the_header_timeout() {
    let running = start(
        ConnectionConfig {
            header_read_timeout: SHORT,
            ..long_timeouts()
        },
        true,
    )
    .await;
    let tcp = TcpStream::connect(running.addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = tls_connector(&running)
        .connect(name, tcp)
        .await
        .expect("the handshake completes");
    let start = Instant::now();
    let (bytes, closed) = read_until_closed(&mut tls).await;
    assert!(bytes.is_empty(), "no answer to a request never sent");
    assert!(
        closed - start >= SHORT * 9 / 10,
        "closed by the header timeout"
    );
    running.shutdown().await;
}

#[tokio::test]
async fn a_request_head_without_its_blank_line_is_closed_after_the_header_timeout() {
    let running = start(
        ConnectionConfig {
            header_read_timeout: SHORT,
            ..long_timeouts()
        },
        false,
    )
    .await;
    let mut tcp = TcpStream::connect(running.addr).await.unwrap();
    let start = Instant::now();
    tcp.write_all(b"GET /api/v1/namespaces HTTP/1.1\r\nhost: localhost\r\n")
        .await
        .unwrap();
    let (bytes, closed) = read_until_closed(&mut tcp).await;
    // Go's server also just closes: an unfinished head gets no answer.
    assert!(bytes.is_empty(), "{}", String::from_utf8_lossy(&bytes));
    assert!(closed - start >= SHORT, "closed by the header timeout");
    running.shutdown().await;
}

#[tokio::test]
async fn a_body_that_stops_short_is_answered_504_and_closed() {
    let running = start(
        ConnectionConfig {
            body_read_timeout: SHORT,
            ..long_timeouts()
        },
        false,
    )
    .await;
    let mut tcp = TcpStream::connect(running.addr).await.unwrap();
    let start = Instant::now();
    tcp.write_all(
        b"POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nhost: localhost\r\n\
          content-type: application/json\r\ncontent-length: 100\r\n\r\n{\"apiVersion\":",
    )
    .await
    .unwrap();
    let (bytes, closed) = read_until_closed(&mut tcp).await;
    assert!(closed - start >= SHORT, "answered by the body timeout");
    let resp = RawResponse::parse(&bytes);
    let status = assert_status(&resp, 504, "Timeout");
    assert_eq!(
        status["message"],
        "Timeout: request did not complete within requested timeout - context deadline exceeded"
    );
    assert_eq!(status["details"], json!({}));
    running.shutdown().await;
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let running = start(
        ConnectionConfig {
            idle_timeout: SHORT,
            ..long_timeouts()
        },
        false,
    )
    .await;
    let mut tcp = TcpStream::connect(running.addr).await.unwrap();
    tcp.write_all(b"GET /version HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .unwrap();
    let start = Instant::now();
    let (bytes, closed) = read_until_closed(&mut tcp).await;
    let resp = RawResponse::parse(&bytes);
    assert_eq!(resp.code, 200, "the request is served before the idle time");
    assert!(
        closed - start >= SHORT * 9 / 10,
        "closed by the idle timeout"
    );
    running.shutdown().await;
}

#[tokio::test]
async fn a_watch_outlives_every_timeout() {
    let running = start(
        ConnectionConfig {
            header_read_timeout: SHORT,
            idle_timeout: SHORT,
            body_read_timeout: SHORT,
            ..long_timeouts()
        },
        false,
    )
    .await;
    let (code, mut watch) =
        common::WatchStream::open(&running, "/api/v1/namespaces/default/configmaps?watch=true")
            .await;
    assert_eq!(code, 200);
    // Witnesses opened after the watch: once the server has closed an idle connection and
    // one with a half-sent head, every timeout has passed for the watch's connection too.
    let mut idle = TcpStream::connect(running.addr).await.unwrap();
    idle.write_all(b"GET /version HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut slow = TcpStream::connect(running.addr).await.unwrap();
    slow.write_all(b"GET /version HTTP/1.1\r\n").await.unwrap();
    read_until_closed(&mut idle).await;
    read_until_closed(&mut slow).await;
    let created = common::post(
        &running,
        "/api/v1/namespaces/default/configmaps",
        &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "after"}}),
    )
    .await;
    assert_eq!(created.status, 201);
    let event = watch.next().await.expect("the watch is still open");
    assert_eq!(event["type"], "ADDED");
    assert_eq!(event["object"]["metadata"]["name"], "after");
    running.shutdown().await;
}

/// Sends `request` on a fresh connection (writing from a task of its own, so a server that
/// answers before reading it all is not blocked) and returns the answer.
async fn exchange(running: &Running, request: Vec<u8>) -> RawResponse {
    let tcp = TcpStream::connect(running.addr).await.unwrap();
    let (mut read, mut write) = tcp.into_split();
    let writer = tokio::spawn(async move {
        // The server may stop reading once it has refused the request.
        let _ = write.write_all(&request).await;
        write
    });
    let (bytes, _) = read_until_closed(&mut read).await;
    drop(writer.await);
    RawResponse::parse(&bytes)
}

#[tokio::test]
async fn a_malformed_chunked_body_is_a_bad_request() {
    let running = start(ConnectionConfig::default(), false).await;
    let resp = exchange(
        &running,
        b"POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nhost: localhost\r\n\
          content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"
            .to_vec(),
    )
    .await;
    assert_status(&resp, 400, "BadRequest");
    let listed = common::get(&running, "/api/v1/namespaces/default/configmaps").await;
    assert_eq!(listed.body["items"], json!([]), "nothing was written");
    running.shutdown().await;
}

#[tokio::test]
async fn a_well_formed_chunked_body_is_read() {
    let running = start(ConnectionConfig::default(), false).await;
    let body = br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"chunked"}}"#;
    let (first, second) = body.split_at(10);
    let mut request = b"POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nhost: localhost\r\n\
          content-type: application/json\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        .to_vec();
    for part in [first, second] {
        request.extend_from_slice(format!("{:x};ext=1\r\n", part.len()).as_bytes());
        request.extend_from_slice(part);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"0\r\ntrailer: x\r\n\r\n");
    let resp = exchange(&running, request).await;
    assert_eq!(resp.code, 201, "{}", String::from_utf8_lossy(&resp.body));
    running.shutdown().await;
}

#[tokio::test]
async fn pipelined_requests_with_bodies_are_each_answered() {
    let running = start(ConnectionConfig::default(), false).await;
    let mut request = Vec::new();
    for name in ["one", "two"] {
        let body =
            format!(r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}"}}}}"#);
        request.extend_from_slice(
            format!(
                "POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nhost: localhost\r\n\
                 content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        );
    }
    request.extend_from_slice(
        b"GET /version HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n",
    );
    let tcp = TcpStream::connect(running.addr).await.unwrap();
    let (mut read, mut write) = tcp.into_split();
    write.write_all(&request).await.unwrap();
    let (bytes, _) = read_until_closed(&mut read).await;
    let text = String::from_utf8_lossy(&bytes);
    assert_eq!(text.matches("HTTP/1.1 201 Created").count(), 2, "{text}");
    assert_eq!(text.matches("HTTP/1.1 200 OK").count(), 1, "{text}");
    running.shutdown().await;
}

#[tokio::test]
async fn a_long_uri_is_answered_414_with_a_status() {
    let running = start(ConnectionConfig::default(), false).await;
    let path = format!("/api/v1/namespaces/{}", "a".repeat(70_000));
    let resp = exchange(
        &running,
        format!("GET {path} HTTP/1.1\r\nhost: localhost\r\n\r\n").into_bytes(),
    )
    .await;
    // No upstream reason names 414; apimachinery's reason for a code it does not know.
    assert_status(&resp, 414, "Unknown");
    running.shutdown().await;
}

#[tokio::test]
async fn a_huge_header_is_answered_431_with_a_status() {
    let running = start(ConnectionConfig::default(), false).await;
    let huge = "x".repeat(1_100_000);
    let resp = exchange(
        &running,
        format!("GET /api/v1/namespaces HTTP/1.1\r\nhost: localhost\r\nx-huge: {huge}\r\n\r\n")
            .into_bytes(),
    )
    .await;
    assert_status(&resp, 431, "Unknown");
    running.shutdown().await;
}

#[tokio::test]
async fn too_many_headers_are_answered_431_with_a_status() {
    let running = start(
        ConnectionConfig {
            max_headers: 8,
            ..ConnectionConfig::default()
        },
        false,
    )
    .await;
    let mut request = b"GET /api/v1/namespaces HTTP/1.1\r\nhost: localhost\r\n".to_vec();
    for i in 0..8 {
        request.extend_from_slice(format!("x-h{i}: v\r\n").as_bytes());
    }
    request.extend_from_slice(b"\r\n");
    let resp = exchange(&running, request).await;
    assert_status(&resp, 431, "Unknown");
    running.shutdown().await;
}

#[tokio::test]
async fn a_malformed_request_line_is_answered_400_with_a_status() {
    let running = start(ConnectionConfig::default(), false).await;
    let resp = exchange(
        &running,
        b"GET /api\x01 HTTP/1.1\r\nhost: localhost\r\n\r\n".to_vec(),
    )
    .await;
    assert_status(&resp, 400, "BadRequest");
    let resp = exchange(
        &running,
        b"GET /api HTTP/9.9\r\nhost: localhost\r\n\r\n".to_vec(),
    )
    .await;
    assert_status(&resp, 400, "BadRequest");
    running.shutdown().await;
}

#[tokio::test]
async fn a_refused_head_after_a_good_request_is_answered_in_order() {
    let running = start(ConnectionConfig::default(), false).await;
    let mut request = b"GET /version HTTP/1.1\r\nhost: localhost\r\n\r\n".to_vec();
    request.extend_from_slice(
        format!(
            "GET /{} HTTP/1.1\r\nhost: localhost\r\n\r\n",
            "a".repeat(70_000)
        )
        .as_bytes(),
    );
    let tcp = TcpStream::connect(running.addr).await.unwrap();
    let (mut read, mut write) = tcp.into_split();
    write.write_all(&request).await.unwrap();
    let (bytes, _) = read_until_closed(&mut read).await;
    let first = RawResponse::parse(&bytes);
    assert_eq!(first.code, 200);
    let first_len =
        String::from_utf8_lossy(&bytes).find("\r\n\r\n").unwrap() + 4 + first.body.len();
    assert_status(&RawResponse::parse(&bytes[first_len..]), 414, "Unknown");
    running.shutdown().await;
}

/// Sends `GET /version` over an HTTP/2 connection on `io`, then waits for the server to close
/// the idle connection; returns when it was closed.
async fn http2_version_then_idle<I>(io: I) -> Instant
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use http_body_util::{BodyExt, Empty};
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(io),
    )
    .await
    .unwrap();
    let conn = tokio::spawn(conn);
    let req = hyper::Request::builder()
        .uri("/version")
        .body(Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.version(), hyper::Version::HTTP_2);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(serde_json::from_slice::<Value>(&body).is_ok());
    // The connection task ends when the server closes the connection.
    let _ = tokio::time::timeout(DEADLINE, conn)
        .await
        .expect("the server closes the idle HTTP/2 connection in time");
    Instant::now()
}

#[tokio::test]
async fn http2_over_tls_and_with_prior_knowledge_is_served_and_closed_when_idle() {
    let config = ConnectionConfig {
        idle_timeout: SHORT,
        ..long_timeouts()
    };
    let running = start(config.clone(), true).await;
    let tcp = TcpStream::connect(running.addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut connector_config = (*tls_client_config(&running)).clone();
    connector_config.alpn_protocols = vec![b"h2".to_vec()];
    let tls = tokio_rustls::TlsConnector::from(Arc::new(connector_config))
        .connect(name, tcp)
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let began = Instant::now();
    let closed = http2_version_then_idle(tls).await;
    assert!(closed - began >= SHORT * 9 / 10);
    running.shutdown().await;

    let running = start(config, false).await;
    let tcp = TcpStream::connect(running.addr).await.unwrap();
    let began = Instant::now();
    let closed = http2_version_then_idle(tcp).await;
    assert!(closed - began >= SHORT * 9 / 10);
    running.shutdown().await;
}

#[tokio::test]
async fn a_head_sent_early_behind_a_watch_does_not_cut_it() {
    let running = start(
        ConnectionConfig {
            header_read_timeout: SHORT,
            idle_timeout: SHORT,
            ..long_timeouts()
        },
        false,
    )
    .await;
    let mut watch = TcpStream::connect(running.addr).await.unwrap();
    watch
        .write_all(
            b"GET /api/v1/namespaces/default/configmaps?watch=true HTTP/1.1\r\n\
              host: localhost\r\n\r\nGET /version HTTP/1.1\r\n",
        )
        .await
        .unwrap();
    // The next head has begun but the server is still answering the watch: Go would not read
    // it yet, and neither times it. A witness shows the header timeout has passed.
    let mut slow = TcpStream::connect(running.addr).await.unwrap();
    slow.write_all(b"GET /version HTTP/1.1\r\n").await.unwrap();
    read_until_closed(&mut slow).await;
    let created = common::post(
        &running,
        "/api/v1/namespaces/default/configmaps",
        &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "behind"}}),
    )
    .await;
    assert_eq!(created.status, 201);
    let mut seen = Vec::new();
    let found = async {
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&seen).contains(r#""name":"behind""#) {
            let n = watch.read(&mut buf).await.unwrap();
            assert!(n > 0, "the watch was closed");
            seen.extend_from_slice(&buf[..n]);
        }
    };
    tokio::time::timeout(DEADLINE, found)
        .await
        .expect("the event arrives on the watch");
    running.shutdown().await;
}
