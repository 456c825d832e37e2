//! What the fuzz targets share: an in-process API server to send requests to, and the checks
//! every response must pass.
//!
//! The server runs on an in-memory store inside the fuzzing process, built once and kept for
//! the whole run. Targets that write send `dryRun=All`, so the server's state stays what it was
//! at start and an input replays the same way whenever it is run again.

use std::sync::OnceLock;

use axum::body::Body;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use setpoint_apiserver::{ApiServer, ServerConfig, StoreConfig};
use tower::ServiceExt;

/// A response: its status code and its body parsed as JSON (`Null` when it is not JSON).
pub struct Reply {
    pub status: u16,
    pub body: Value,
    pub raw: bytes::Bytes,
}

/// The in-process server and the runtime its tasks run on.
pub struct Server {
    rt: tokio::runtime::Runtime,
    router: axum::Router,
}

/// Objects that exist from the start, for targets that read or patch them: (collection path,
/// object). Their names are what [`Server::object_path`] addresses.
pub fn fixtures() -> Vec<(&'static str, Value)> {
    vec![
        (
            "/api/v1/namespaces/default/configmaps",
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "cm", "labels": {"app": "web"}},
                   "data": {"a": "1", "b": "two"}}),
        ),
        (
            "/apis/apps/v1/namespaces/default/deployments",
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                   "metadata": {"name": "web", "labels": {"app": "web"}},
                   "spec": {"replicas": 2,
                            "selector": {"matchLabels": {"app": "web"}},
                            "template": {"metadata": {"labels": {"app": "web"}},
                                         "spec": {"containers": [
                                            {"name": "c", "image": "nginx:1.27",
                                             "ports": [{"containerPort": 80, "protocol": "TCP"}],
                                             "env": [{"name": "A", "value": "1"}]},
                                            {"name": "sidecar", "image": "busybox"}]}}}}),
        ),
        (
            "/api/v1/namespaces/default/pods",
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "p", "labels": {"app": "web", "tier": "fe"},
                                "finalizers": ["example.com/x"]},
                   "spec": {"containers": [{"name": "c", "image": "nginx",
                                            "resources": {"limits": {"cpu": "500m"}}}],
                            "tolerations": [{"key": "k", "operator": "Exists"}]}}),
        ),
        (
            "/api/v1/namespaces/default/services",
            json!({"apiVersion": "v1", "kind": "Service",
                   "metadata": {"name": "svc"},
                   "spec": {"selector": {"app": "web"},
                            "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}),
        ),
    ]
}

impl Server {
    /// The object path of fixture `i` (wrapping around).
    pub fn object_path(i: usize) -> String {
        let all = fixtures();
        let (collection, obj) = &all[i % all.len()];
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        format!("{collection}/{name}")
    }

    /// Sends one request and reads the whole response.
    pub fn request(&self, method: &str, uri: &str, content_type: &str, body: Vec<u8>) -> Reply {
        self.rt.block_on(async {
            let req = http::Request::builder()
                .method(method)
                .uri(uri)
                .header(http::header::CONTENT_TYPE, content_type)
                .header(http::header::USER_AGENT, "fuzz/v0")
                .body(Body::from(body))
                .expect("a well-formed request");
            let resp = self
                .router
                .clone()
                .oneshot(req)
                .await
                .expect("the router is infallible");
            let status = resp.status().as_u16();
            let raw = resp
                .into_body()
                .collect()
                .await
                .expect("an in-memory body")
                .to_bytes();
            let body = serde_json::from_slice(&raw).unwrap_or(Value::Null);
            Reply { status, body, raw }
        })
    }
}

/// The server, started on first use with the [`fixtures`] created.
pub fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| {
        // One thread: requests run inside `block_on`, and the server's own tasks (watch
        // cache feed, CRD loop) progress while a request waits, as they would on a busy server.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let router = rt.block_on(async {
            let config = ServerConfig {
                listen: "127.0.0.1:0".parse().expect("an address"),
                insecure_http: true,
                store: StoreConfig::Memory,
                ..ServerConfig::default()
            };
            let store = ApiServer::open_store(&config)
                .await
                .expect("an in-memory store");
            let server = ApiServer::new(config, store).await.expect("a server");
            setpoint_apiserver::http::router(server)
        });
        let server = Server { rt, router };
        for (collection, obj) in fixtures() {
            let reply = server.request(
                "POST",
                collection,
                "application/json",
                serde_json::to_vec(&obj).expect("JSON"),
            );
            assert_eq!(reply.status, 201, "creating a fixture: {}", reply.body);
        }
        server
    })
}

/// Checks what every API response must be: a JSON object, never a server error; an error is
/// a `Status` whose `code` is the response's status code.
pub fn check_reply(what: &str, reply: &Reply) {
    assert!(
        reply.status < 500,
        "{what}: server error {}: {}",
        reply.status,
        String::from_utf8_lossy(&reply.raw)
    );
    assert!(
        reply.body.is_object(),
        "{what}: {} with a body that is not a JSON object: {:?}",
        reply.status,
        String::from_utf8_lossy(&reply.raw)
    );
    if reply.status >= 400 {
        let b = &reply.body;
        assert_eq!(b["kind"], "Status", "{what}: an error is a Status: {b}");
        assert_eq!(b["status"], "Failure", "{what}: {b}");
        assert_eq!(
            b["code"].as_u64(),
            Some(u64::from(reply.status)),
            "{what}: the Status carries the response's code: {b}"
        );
        assert!(
            b["reason"].is_string() && b["message"].is_string(),
            "{what}: a Status has a reason and a message: {b}"
        );
    }
}

/// Splits `data` at the first `\n`: (first line, rest). No `\n`: the whole input, empty rest.
pub fn first_line(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|&b| b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[]),
    }
}
