//! Admission and conversion webhooks served by the test process itself, as
//! controller-runtime's envtest `WebhookInstallOptions` serves them: [`WebhookServer`]
//! answers `AdmissionReview`s and `ConversionReview`s over HTTPS on a free loopback port with
//! a certificate of a CA made for it, [`TestCluster::install_webhooks`] registers admission
//! configurations pointed at it, and [`WebhookServer::conversion`] is the `spec.conversion`
//! of a CRD whose conversion webhook it serves ([`conversion_response`] answers a review
//! with a function converting one object).
//!
//! ```no_run
//! # async fn demo() {
//! use serde_json::json;
//! let cluster = setpoint_testing::TestCluster::start().await;
//! let hooks = setpoint_testing::webhook::WebhookServer::start(|_path, request| {
//!     let forbidden = request.pointer("/object/data/forbidden").is_some();
//!     json!({"allowed": !forbidden, "status": {"message": "no key \"forbidden\""}})
//! })
//! .await;
//! let config = json!({
//!     "apiVersion": "admissionregistration.k8s.io/v1",
//!     "kind": "ValidatingWebhookConfiguration",
//!     "metadata": {"name": "configmaps"},
//!     "webhooks": [{"name": "configmaps.example.com", "sideEffects": "None",
//!         "admissionReviewVersions": ["v1"], "clientConfig": {"url": "https://x/validate"},
//!         "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
//!                    "resources": ["configmaps"]}]}]
//! });
//! cluster.install_webhooks(&hooks, &[config]).await.unwrap();
//! # }
//! ```

use std::convert::Infallible;
use std::sync::Arc;

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use serde_json::{json, Value};
use setpoint_runtime::client::{
    Api, ApiResource, ClientError, DynamicObject, ListParams, PostParams,
};

use crate::TestCluster;

/// The largest review body the server reads.
const MAX_BODY: usize = 3 * 1024 * 1024;

/// What answers a review (admission or conversion): gets the request's path and its
/// `request`, returns its `response` (`uid` is filled in when left out).
type Handler = dyn Fn(&str, &Value) -> Value + Send + Sync;

/// An HTTPS server answering admission and conversion reviews, stopped when dropped.
pub struct WebhookServer {
    port: u16,
    ca_pem: String,
    task: tokio::task::JoinHandle<()>,
}

impl WebhookServer {
    /// Serves `handler` on `127.0.0.1` at a free port, with a certificate for `127.0.0.1`
    /// signed by a CA generated for this server.
    pub async fn start(
        handler: impl Fn(&str, &Value) -> Value + Send + Sync + 'static,
    ) -> WebhookServer {
        let (ca_pem, cert_pem, key_pem) = certificates("127.0.0.1");
        let tls = server_tls(&cert_pem, &key_pem);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let port = listener.local_addr().expect("bound address").port();
        let handler: Arc<Handler> = Arc::new(handler);
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, handler) = (acceptor.clone(), handler.clone());
                // Answers go out at once: with Nagle's algorithm, a response written in two
                // parts waits for the API server's delayed ACK, about 40 ms a call.
                let _ = tcp.set_nodelay(true);
                tokio::spawn(async move {
                    let Ok(stream) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |req| {
                        let handler = handler.clone();
                        async move { Ok::<_, Infallible>(answer(&*handler, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        WebhookServer { port, ca_pem, task }
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `https://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.port)
    }

    /// The CA certificate (PEM) its certificate is signed by.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A `clientConfig` for a webhook served at `path`.
    pub fn client_config(&self, path: &str) -> Value {
        json!({
            "url": self.url(path),
            "caBundle": base64::engine::general_purpose::STANDARD.encode(&self.ca_pem),
        })
    }
}

impl WebhookServer {
    /// A CRD's `spec.conversion` naming the conversion webhook served at `path`
    /// (`strategy: Webhook`, `ConversionReview` v1).
    pub fn conversion(&self, path: &str) -> Value {
        json!({
            "strategy": "Webhook",
            "webhook": {
                "clientConfig": self.client_config(path),
                "conversionReviewVersions": ["v1"],
            },
        })
    }
}

/// The `response` of a `ConversionReview` whose `request` is `request`: every object given to
/// `convert` with the `desiredAPIVersion`, which returns it in that version (its
/// `apiVersion` is set for it) or why it cannot be, which fails the whole review with that
/// message (the API server then answers the client with it). Metadata other than labels and
/// annotations is restored by the API server, so `convert` need not keep it.
pub fn conversion_response(
    request: &Value,
    convert: impl Fn(Value, &str) -> Result<Value, String>,
) -> Value {
    let desired = request
        .get("desiredAPIVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let objects = request
        .get("objects")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut converted = Vec::with_capacity(objects.len());
    for object in objects {
        match convert(object, desired) {
            Ok(mut o) => {
                o["apiVersion"] = json!(desired);
                converted.push(o);
            }
            Err(message) => {
                return json!({"result": {"status": "Failure", "message": message}});
            }
        }
    }
    json!({"result": {"status": "Success"}, "convertedObjects": converted})
}

impl Drop for WebhookServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(
    handler: &Handler,
    req: http::Request<hyper::body::Incoming>,
) -> http::Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    let reply = |status: u16, body: Vec<u8>| {
        http::Response::builder()
            .status(status)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .expect("a valid response")
    };
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return reply(400, e.to_string().into_bytes()),
    };
    let Ok(review) = serde_json::from_slice::<Value>(&body) else {
        return reply(400, b"not an AdmissionReview or ConversionReview".to_vec());
    };
    let request = review.get("request").cloned().unwrap_or(Value::Null);
    let mut response = handler(&path, &request);
    if response.get("uid").is_none() {
        response["uid"] = request.get("uid").cloned().unwrap_or(Value::Null);
    }
    // The answer is of the review's own type and version (a ConversionReview's version is
    // one the CRD's `conversionReviewVersions` names).
    let out = match review.get("kind").and_then(Value::as_str) {
        Some("ConversionReview") => json!({
            "apiVersion": review.get("apiVersion").cloned().unwrap_or(Value::Null),
            "kind": "ConversionReview",
            "response": response,
        }),
        _ => json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                    "response": response}),
    };
    reply(200, serde_json::to_vec(&out).expect("JSON"))
}

/// A fresh CA and a serving certificate it signed for `name` (a DNS name or an IP address):
/// (CA PEM, certificate PEM, key PEM). What a test's HTTPS servers present, with the CA as the
/// `caBundle` the API server verifies them by.
pub fn certificates(name: &str) -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca_params = CertificateParams::new(vec![]).expect("CA parameters");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).expect("CA certificate");
    let issuer = Issuer::from_params(&ca_params, &ca_key);
    let key = KeyPair::generate().expect("server key");
    let cert = CertificateParams::new(vec![name.to_string()])
        .expect("server parameters")
        .signed_by(&key, &issuer)
        .expect("server certificate");
    (ca.pem(), cert.pem(), key.serialize_pem())
}

fn server_tls(cert: &str, key: &str) -> Arc<rustls::ServerConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = vec![CertificateDer::from_pem_slice(cert.as_bytes()).expect("certificate PEM")];
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key PEM");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("server certificate and key");
    Arc::new(config)
}

impl TestCluster {
    /// Creates webhook configurations (`MutatingWebhookConfiguration` or
    /// `ValidatingWebhookConfiguration` objects) with every webhook's `clientConfig` pointed
    /// at `server` (the path of its `url` or `service` kept), and returns once the server
    /// applies them to writes.
    pub async fn install_webhooks(
        &self,
        server: &WebhookServer,
        configurations: &[Value],
    ) -> Result<(), ClientError> {
        for config in configurations {
            let mut config = config.clone();
            let kind = config.get("kind").and_then(Value::as_str).unwrap_or("");
            let plural = match kind {
                "MutatingWebhookConfiguration" => "mutatingwebhookconfigurations",
                _ => "validatingwebhookconfigurations",
            };
            let resource =
                ApiResource::new("admissionregistration.k8s.io", "v1", kind, plural, false);
            for hook in config
                .get_mut("webhooks")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                let path = webhook_path(hook.get("clientConfig").unwrap_or(&Value::Null));
                hook["clientConfig"] = server.client_config(&path);
            }
            let api: Api<DynamicObject> = Api::dynamic(self.client(), &resource, None);
            let created = api
                .create(&PostParams::default(), &DynamicObject(config))
                .await?;
            let rv = created
                .0
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .unwrap_or("0")
                .to_string();
            // A list not older than the write is answered from the watch cache admission
            // reads configurations from, once that cache holds the write.
            api.list(&ListParams {
                resource_version: Some(rv),
                resource_version_match: Some("NotOlderThan".into()),
                ..ListParams::default()
            })
            .await?;
        }
        Ok(())
    }
}

/// The path a `clientConfig` names (`/` when none).
fn webhook_path(config: &Value) -> String {
    if let Some(url) = config.get("url").and_then(Value::as_str) {
        let rest = url.split_once("://").map_or(url, |(_, r)| r);
        return rest
            .find('/')
            .map_or("/".to_string(), |i| rest[i..].to_string());
    }
    match config.pointer("/service/path").and_then(Value::as_str) {
        Some(p) if !p.is_empty() => p.to_string(),
        _ => "/".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_kept_from_urls_and_services() {
        assert_eq!(
            webhook_path(&json!({"url": "https://x:1/validate"})),
            "/validate"
        );
        assert_eq!(webhook_path(&json!({"url": "https://x"})), "/");
        assert_eq!(
            webhook_path(&json!({"service": {"name": "s", "namespace": "n", "path": "/m"}})),
            "/m"
        );
    }
}
