//! Shared helpers for the API server's integration tests: an in-process server on a free port
//! and a minimal HTTP/1.1 client.
#![allow(dead_code)]

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use setpoint_apiserver::server::Running;
use setpoint_apiserver::watchcache::CacheConfig;
use setpoint_apiserver::{ApiServer, ServerConfig, StoreConfig};

/// Starts a plain-HTTP server on an in-memory (or embedded) store.
pub async fn start_with(store: StoreConfig, cache: CacheConfig) -> Running {
    let config = ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        insecure_http: true,
        store,
        cache,
        ..ServerConfig::default()
    };
    let s = ApiServer::open_store(&config).await.unwrap();
    let server = ApiServer::new(config, s).await.unwrap();
    server.serve().await.unwrap()
}

/// A plain-HTTP server's config on an in-memory store, for tests that open the store
/// themselves.
pub fn memory_config() -> ServerConfig {
    ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        insecure_http: true,
        store: StoreConfig::Memory,
        ..ServerConfig::default()
    }
}

/// A server on an in-memory store with the default cache.
pub async fn start() -> Running {
    start_with(StoreConfig::Memory, CacheConfig::default()).await
}

/// A response: status code, headers and the body parsed as JSON (Null if it isn't).
pub struct Resp {
    /// The status code.
    pub status: u16,
    /// The response headers.
    pub headers: http::HeaderMap,
    /// The body as JSON, or `Null`.
    pub body: Value,
    /// The body as received.
    pub raw: Bytes,
}

/// One request on a fresh connection.
pub async fn call(
    running: &Running,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: Option<Vec<u8>>,
) -> Resp {
    call_with(running, method, path, content_type, body, &[]).await
}

/// One request on a fresh connection, with extra headers.
pub async fn call_with(
    running: &Running,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: Option<Vec<u8>>,
    headers: &[(&str, &str)],
) -> Resp {
    let stream = tokio::net::TcpStream::connect(running.addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut b = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost");
    if let Some(ct) = content_type {
        b = b.header("content-type", ct);
    }
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let req = b
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let raw = resp.into_body().collect().await.unwrap().to_bytes();
    let body = serde_json::from_slice(&raw).unwrap_or(Value::Null);
    Resp {
        status,
        headers,
        body,
        raw,
    }
}

/// GET `path`.
pub async fn get(r: &Running, path: &str) -> Resp {
    call(r, "GET", path, None, None).await
}
/// POST `v` as JSON to `path`.
pub async fn post(r: &Running, path: &str, v: &Value) -> Resp {
    call(
        r,
        "POST",
        path,
        Some("application/json"),
        Some(serde_json::to_vec(v).unwrap()),
    )
    .await
}
/// PUT `v` as JSON to `path`.
pub async fn put(r: &Running, path: &str, v: &Value) -> Resp {
    call(
        r,
        "PUT",
        path,
        Some("application/json"),
        Some(serde_json::to_vec(v).unwrap()),
    )
    .await
}
/// PATCH `path` with `v` as a patch of content type `ct`.
pub async fn patch(r: &Running, path: &str, ct: &str, v: &Value) -> Resp {
    call(
        r,
        "PATCH",
        path,
        Some(ct),
        Some(serde_json::to_vec(v).unwrap()),
    )
    .await
}
/// DELETE `path`.
pub async fn delete(r: &Running, path: &str) -> Resp {
    call(r, "DELETE", path, None, None).await
}

/// A streaming watch: yields parsed event lines.
pub struct WatchStream {
    body: hyper::body::Incoming,
    buf: Vec<u8>,
}

impl WatchStream {
    /// Opens a watch on `path`; returns the status code and the stream.
    pub async fn open(running: &Running, path: &str) -> (u16, WatchStream) {
        Self::open_with(running, path, &[]).await
    }

    /// [`WatchStream::open`] with extra request headers.
    pub async fn open_with(
        running: &Running,
        path: &str,
        headers: &[(&str, &str)],
    ) -> (u16, WatchStream) {
        let stream = tokio::net::TcpStream::connect(running.addr).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        let mut b = Request::builder()
            .method("GET")
            .uri(path)
            .header("host", "localhost");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let req = b.body(Full::new(Bytes::new())).unwrap();
        let resp = sender.send_request(req).await.unwrap();
        (
            resp.status().as_u16(),
            WatchStream {
                body: resp.into_body(),
                buf: Vec::new(),
            },
        )
    }

    /// The next event, or None when the stream ends. Panics after the deadline.
    pub async fn next(&mut self) -> Option<Value> {
        tokio::time::timeout(std::time::Duration::from_secs(10), self.next_inner())
            .await
            .expect("watch event in time")
    }

    async fn next_inner(&mut self) -> Option<Value> {
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                return Some(serde_json::from_slice(&line).expect("event is JSON"));
            }
            match self.body.frame().await {
                Some(Ok(f)) => {
                    if let Ok(d) = f.into_data() {
                        self.buf.extend_from_slice(&d);
                    }
                }
                _ => return None,
            }
        }
    }
}

/// `v` in an `Arc`.
pub fn shared<T>(v: T) -> Arc<T> {
    Arc::new(v)
}
