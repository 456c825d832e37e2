//! How requests reach an API server: the [`Transport`] trait, with an HTTPS implementation
//! for any Kubernetes-compatible server and [`ServiceTransport`] for an in-process server (any
//! `tower::Service`, e.g. Setpoint's API router — same admission and storage path, no sockets).

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use tower::ServiceExt;

use super::kubeconfig::Kubeconfig;
use super::ClientError;

/// A boxed error for response bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A response body that can be read as a whole or streamed (watches).
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

/// Sends one request and returns the response with a streaming body.
#[async_trait]
pub trait Transport: Send + Sync + 'static {
    /// Sends `req` and returns the response once its head has arrived. Any HTTP status is
    /// `Ok`; an error means the request got no answer ([`ClientError::Transport`]) or could not
    /// be formed ([`ClientError::Config`]).
    async fn send(&self, req: http::Request<Bytes>) -> Result<http::Response<Body>, ClientError>;
}

/// A transport over any `tower::Service` that speaks HTTP (the in-process API server).
#[derive(Clone)]
pub struct ServiceTransport<S> {
    service: S,
}

impl<S> ServiceTransport<S> {
    /// A transport that hands every request to a clone of `service`.
    pub fn new(service: S) -> Self {
        ServiceTransport { service }
    }
}

#[async_trait]
impl<S, B> Transport for ServiceTransport<S>
where
    S: tower::Service<http::Request<Full<Bytes>>, Response = http::Response<B>>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    async fn send(&self, req: http::Request<Bytes>) -> Result<http::Response<Body>, ClientError> {
        let resp = self
            .service
            .clone()
            .oneshot(req.map(Full::new))
            .await
            .map_err(|e| ClientError::Transport(e.into().to_string()))?;
        Ok(resp.map(|b| b.map_err(Into::into).boxed_unsync()))
    }
}

/// HTTPS (or plain HTTP) to a server described by a kubeconfig: the server URL, its CA, and a
/// client certificate or bearer token. Connections are pooled; HTTP/2 is used when offered.
pub struct HttpsTransport {
    base: String,
    token: Option<String>,
    client: HyperClient<
        hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
        Full<Bytes>,
    >,
}

impl HttpsTransport {
    /// Builds a transport from a parsed kubeconfig's current context.
    pub fn from_kubeconfig(kc: &Kubeconfig) -> Result<Self, ClientError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        if let Some(ca) = &kc.ca_pem {
            use rustls_pki_types::pem::PemObject;
            for c in rustls_pki_types::CertificateDer::pem_slice_iter(ca.as_bytes()) {
                let c = c.map_err(|e| ClientError::Config(format!("CA certificate: {e}")))?;
                roots
                    .add(c)
                    .map_err(|e| ClientError::Config(format!("CA certificate: {e}")))?;
            }
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| ClientError::Config(e.to_string()))?;
        let builder = if kc.insecure_skip_tls_verify {
            builder
                .dangerous()
                .with_custom_certificate_verifier(setpoint_api::tls::AnyServerCert::new(provider))
        } else {
            builder.with_root_certificates(roots)
        };
        let tls = match (&kc.client_cert_pem, &kc.client_key_pem) {
            (Some(cert), Some(key)) => {
                use rustls_pki_types::pem::PemObject;
                let certs = rustls_pki_types::CertificateDer::pem_slice_iter(cert.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| ClientError::Config(format!("client certificate: {e}")))?;
                let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes())
                    .map_err(|e| ClientError::Config(format!("client key: {e}")))?;
                builder
                    .with_client_auth_cert(certs, key)
                    .map_err(|e| ClientError::Config(e.to_string()))?
            }
            _ => builder.with_no_client_auth(),
        };
        // hyper-rustls sets ALPN (h2, http/1.1) itself from the enabled protocols.
        // Small API requests must not wait for Nagle's algorithm (~40 ms with delayed ACKs).
        let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
        http.set_nodelay(true);
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(http);
        let client = HyperClient::builder(TokioExecutor::new())
            .pool_max_idle_per_host(64)
            .build(connector);
        Ok(HttpsTransport {
            base: kc.server.trim_end_matches('/').to_string(),
            token: kc.token.clone(),
            client,
        })
    }
}

#[async_trait]
impl Transport for HttpsTransport {
    async fn send(&self, req: http::Request<Bytes>) -> Result<http::Response<Body>, ClientError> {
        let (mut parts, body) = req.into_parts();
        let path = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        parts.uri = format!("{}{}", self.base, path)
            .parse()
            .map_err(|e| ClientError::Config(format!("URL: {e}")))?;
        if let Some(t) = &self.token {
            let v = http::HeaderValue::from_str(&format!("Bearer {t}"))
                .map_err(|e| ClientError::Config(e.to_string()))?;
            parts.headers.insert(http::header::AUTHORIZATION, v);
        }
        let resp = self
            .client
            .request(http::Request::from_parts(parts, Full::new(body)))
            .await
            .map_err(|e| ClientError::Transport(format!("{e:?}")))?;
        Ok(resp.map(|b| b.map_err(|e| Box::new(e) as BoxError).boxed_unsync()))
    }
}
